"""Prometheus (Debian's `prometheus` package, with `promtool`): scrapes what the chart's monitors select.

The stack runs no Prometheus Operator, and Debian builds Prometheus without Kubernetes service
discovery (client-go is not packaged in Debian). So a small loop of the stack's own (`python -m
fibers_stack.discovery`, started with the stack as `prometheus-discovery`) does both, every
`DISCOVERY_SECONDS`: it turns each ServiceMonitor and PodMonitor in the cluster into a scrape job and
each PrometheusRule into a rule file, as the Prometheus Operator would, and writes each job's targets
(the Endpoints or Pods in the selected namespaces) to a file_sd file, labelled with the
`__meta_kubernetes_*` labels Kubernetes discovery would give them. The jobs relabel those exactly as the
Prometheus Operator's do: keep what the selector and port select, `job` from the Service's name,
`namespace`/`pod`/`service` target labels, `honorLabels`. Only the fields the Fibers chart uses are
translated; others are refused by name, so a chart change that needs more fails here instead of
scraping something else.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, cast

import yaml

from fibers_stack import crds
from fibers_stack.launcher import Launcher
from fibers_stack.layout import prometheus_operator_crds
from fibers_stack.network import NODE_IP
from fibers_stack.process import free_port

log = logging.getLogger("fibers_stack.prometheus")

GROUP, VERSION = "monitoring.coreos.com", "v1"
KINDS = ("servicemonitors", "podmonitors", "prometheusrules")
SCRAPE_INTERVAL = "5s"  # short, so tests see series soon after a pod starts; the chart's default is 30s
EVALUATION_INTERVAL = "5s"


def crd_paths() -> list[Path]:
    """The CRDs of the kinds the chart creates (the Prometheus Operator has more)."""
    return [prometheus_operator_crds() / f"{GROUP}_{kind}.yaml" for kind in KINDS]


def install_crds(api: Any) -> None:
    """Serve ServiceMonitor, PodMonitor and PrometheusRule, so `helm install` with them enabled works and
    the API server validates them against the Prometheus Operator's own schemas."""
    crds.apply(api, paths=crd_paths(), timeout=60)


def binary(name: str = "prometheus") -> Path:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is missing: `make system-packages` installs Debian's prometheus package")
    return Path(found)


def home(run_dir: Path) -> Path:
    return run_dir / "prometheus"


def start(launcher: Launcher) -> dict[str, str]:
    """Prometheus with no scrape job yet; the discovery loop (`sync`) adds the monitors' jobs and rules."""
    root = home(launcher.run_dir)
    (root / "rules").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    (root / "prometheus.yml").write_text(_config_text(root, []))
    port = free_port()
    url = f"http://{NODE_IP}:{port}"
    launcher.spawn(
        "prometheus",
        [
            str(binary()),
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address={NODE_IP}:{port}",
            "--web.enable-lifecycle",  # POST /-/reload after `sync` changed the jobs or rules
            "--storage.tsdb.retention.time=1d",
        ],
    )
    launcher.wait("prometheus", lambda: _ready(url), timeout=60)
    return {"prometheus_url": url}


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _config_text(root: Path, jobs: list[dict[str, Any]]) -> str:
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(root / "rules" / "*.yaml")],
        "scrape_configs": jobs,
    }
    return yaml.safe_dump(config, sort_keys=False)


def _label(name: str) -> str:
    """A Kubernetes label name as a Prometheus meta label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _selector_keeps(kind: str, selector: dict[str, Any]) -> list[dict[str, Any]]:
    """A label selector as relabelling rules, as the Prometheus Operator writes them: matchLabels and the
    four operators of matchExpressions."""
    unsupported = set(selector) - {"matchLabels", "matchExpressions"}
    if unsupported:
        raise ValueError(f"selector fields not translated here: {sorted(unsupported)}")

    def sources(key: str) -> list[str]:
        return [f"__meta_kubernetes_{kind}_label_{_label(key)}", f"__meta_kubernetes_{kind}_labelpresent_{_label(key)}"]

    rules = [
        {"source_labels": sources(key), "regex": f"({re.escape(str(value))});true", "action": "keep"}
        for key, value in (selector.get("matchLabels") or {}).items()
    ]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = "|".join(re.escape(str(v)) for v in expression.get("values") or [])
        present = [sources(key)[1]]
        if operator == "In":
            rules.append({"source_labels": sources(key), "regex": f"({values});true", "action": "keep"})
        elif operator == "NotIn":
            rules.append({"source_labels": sources(key), "regex": f"({values});true", "action": "drop"})
        elif operator == "Exists":
            rules.append({"source_labels": present, "regex": "true", "action": "keep"})
        elif operator == "DoesNotExist":
            rules.append({"source_labels": present, "regex": "true", "action": "drop"})
        else:
            raise ValueError(f"selector operator not translated here: {operator}")
    return rules


def _namespaces(monitor: dict[str, Any]) -> list[str]:
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return []
    return list(chosen.get("matchNames") or [monitor["metadata"]["namespace"]])


def job_name(kind: str, monitor: dict[str, Any], index: int) -> str:
    return f"{kind[:-1]}/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/{index}"


def targets_file(root: Path, job: str) -> Path:
    return root / "targets" / (re.sub(r"[^a-zA-Z0-9_.-]", "_", job) + ".json")


def scrape_jobs(monitor: dict[str, Any], kind: str, root: Path) -> list[dict[str, Any]]:
    """The scrape jobs the Prometheus Operator makes of one ServiceMonitor or PodMonitor."""
    spec, meta = monitor["spec"], monitor["metadata"]
    role, endpoints_key = ("endpoints", "endpoints") if kind == "servicemonitors" else ("pod", "podMetricsEndpoints")
    owner = "service" if role == "endpoints" else "pod"
    jobs = []
    for index, endpoint in enumerate(spec.get(endpoints_key) or []):
        unsupported = set(endpoint) - {"port", "path", "interval", "honorLabels", "scheme"}
        if unsupported:
            raise ValueError(f"{meta['name']}: endpoint fields not translated here: {sorted(unsupported)}")
        port_label = (
            "__meta_kubernetes_endpoint_port_name"
            if role == "endpoints"
            else "__meta_kubernetes_pod_container_port_name"
        )
        relabel = [
            *_selector_keeps(owner, spec.get("selector") or {}),
            {"source_labels": [port_label], "regex": re.escape(endpoint["port"]), "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ]
        if role == "endpoints":
            relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"})
            relabel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"})
        else:
            relabel.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
        relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
        name = job_name(kind, monitor, index)
        job = {
            "job_name": name,
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "file_sd_configs": [{"files": [str(targets_file(root, name))], "refresh_interval": "5s"}],
            "relabel_configs": relabel,
        }
        if "interval" in endpoint:
            job["scrape_interval"] = endpoint["interval"]
        jobs.append(job)
    return jobs


def _meta_labels(kind: str, labels: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in labels.items():
        out[f"__meta_kubernetes_{kind}_label_{_label(key)}"] = value
        out[f"__meta_kubernetes_{kind}_labelpresent_{_label(key)}"] = "true"
    return out


def _items(answer: Any) -> list[dict[str, Any]]:
    """The items of a listing asked for with `_preload_content=False` (plain dicts, as the API sent them)."""
    return list(json.loads(answer.data)["items"])


def endpoint_targets(api: Any, namespaces: list[str]) -> list[dict[str, Any]]:
    """Every address and port of every Endpoints object, as Kubernetes discovery's `endpoints` role labels it."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    raw: dict[str, Any] = {"_preload_content": False}
    if not namespaces:
        namespaces = [n["metadata"]["name"] for n in _items(core.list_namespace(**raw))]
    groups = []
    for namespace in namespaces:
        services = {s["metadata"]["name"]: s for s in _items(core.list_namespaced_service(namespace, **raw))}
        for endpoints in _items(core.list_namespaced_endpoints(namespace, **raw)):
            service = services.get(endpoints["metadata"]["name"])
            if service is None:
                continue
            base = {
                "__meta_kubernetes_namespace": namespace,
                "__meta_kubernetes_service_name": service["metadata"]["name"],
                **_meta_labels("service", service["metadata"].get("labels") or {}),
            }
            for subset in endpoints.get("subsets") or []:
                for address in subset.get("addresses") or []:
                    ref = address.get("targetRef") or {}
                    for port in subset.get("ports") or []:
                        labels = {
                            **base,
                            "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                            "__meta_kubernetes_pod_name": ref.get("name", "") if ref.get("kind") == "Pod" else "",
                        }
                        groups.append({"targets": [f"{address['ip']}:{port['port']}"], "labels": labels})
    return groups


def pod_targets(api: Any, namespaces: list[str]) -> list[dict[str, Any]]:
    """Every named container port of every running pod, as Kubernetes discovery's `pod` role labels it."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    raw: dict[str, Any] = {"_preload_content": False}
    if namespaces:
        pods = [p for namespace in namespaces for p in _items(core.list_namespaced_pod(namespace, **raw))]
    else:
        pods = _items(core.list_pod_for_all_namespaces(**raw))
    groups = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        base = {
            "__meta_kubernetes_namespace": pod["metadata"]["namespace"],
            "__meta_kubernetes_pod_name": pod["metadata"]["name"],
            **_meta_labels("pod", pod["metadata"].get("labels") or {}),
        }
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                }
                groups.append({"targets": [f"{status['podIP']}:{port['containerPort']}"], "labels": labels})
    return groups


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)  # Prometheus never reads half a file
    return True


def sync(root: Path, api: Any, prometheus_url: str) -> None:
    """One pass: the monitors and rules in the cluster, their targets now; Prometheus reloaded on a change."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    monitors: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        listing = cast(dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, kind))
        monitors[kind] = list(listing["items"])
    (root / "targets").mkdir(exist_ok=True)
    jobs = []
    for kind in ("servicemonitors", "podmonitors"):
        for monitor in monitors[kind]:
            found = (endpoint_targets if kind == "servicemonitors" else pod_targets)(api, _namespaces(monitor))
            for job in scrape_jobs(monitor, kind, root):
                _write_if_changed(targets_file(root, job["job_name"]), json.dumps(found, indent=1, sort_keys=True))
                jobs.append(job)
    changed = _write_if_changed(root / "prometheus.yml", _config_text(root, jobs))
    wanted = {
        f"{r['metadata']['namespace']}-{r['metadata']['name']}.yaml": yaml.safe_dump(
            {"groups": r["spec"]["groups"]}, sort_keys=False
        )
        for r in monitors["prometheusrules"]
    }
    for old in (root / "rules").glob("*.yaml"):
        if old.name not in wanted:
            old.unlink()
            changed = True
    for name, text in wanted.items():
        changed = _write_if_changed(root / "rules" / name, text) or changed
    if changed:
        request = urllib.request.Request(f"{prometheus_url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass


DISCOVERY_SECONDS = 5.0  # how soon a new monitor, rule or pod is scraped


def discover(root: Path, kubeconfig: str, prometheus_url: str) -> None:
    """The discovery loop (`python -m fibers_stack.discovery`): a failed pass is logged and retried."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    while True:
        try:
            sync(root, api, prometheus_url)
        except Exception as exc:  # an API server restarting, a monitor this translation refuses: say so, go on
            log.warning("prometheus discovery pass failed: %s", exc)
        time.sleep(DISCOVERY_SECONDS)


def start_discovery(launcher: Launcher, kubeconfig: str, prometheus_url: str) -> None:
    root = home(launcher.run_dir)
    launcher.spawn(
        "prometheus-discovery",
        [sys.executable, "-m", "fibers_stack.discovery", str(root), kubeconfig, prometheus_url],
    )


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(address, timeout=30) as answer:
        body = json.loads(answer.read())
    if body.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {body}")
    return list(body["data"]["result"])
