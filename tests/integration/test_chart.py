"""The Helm chart and the Argo CD health check (marker `chart`).

- helm lint, and values.schema.json refusing unknown keys;
- helm template in both RBAC modes, every object validated by the stack's kube-apiserver
  (server-side dry run, strict field validation; the pod under the `restricted` Pod Security level);
- the chart's CRDs are crds/, and the argocd-cm snippet carries health.lua (tools/sync_chart_crds.py);
- helm install, then the operator run with the Deployment's args and env and the chart's own
  ServiceAccount token: a Connect becomes Ready; with `patch` on connects/status taken away, a new
  Connect does not, and the operator's log names the missing permission;
- the Lua health check in Lua 5.1 (lupa), against tests/fixtures/status (statuses the operator's own
  report() functions wrote; each is also patched into a live object with strict validation).

The image's entry points run in the stack's pods (built from the Dockerfile: the operator installed by the
chart, the Transform job in its driver); hadolint checks the Dockerfile in `make lint`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from fibers.api import ANNOTATION_OWNED_CONNECTOR, CONNECT_FINALIZER
from fibers.conditions import find
from fibers_stack import StackInfo, fetch
from tests.helpers import (
    CHART,
    HEALTH,
    STATUS_FIXTURES,
    Resources,
    produce,
    read_topic,
    render_chart,
    spark_apps,
    status_fixture,
    wait_for,
)

pytestmark = pytest.mark.chart

REPO = Path(__file__).resolve().parents[2]
HEALTH_LUA = CHART / "argocd" / "health.lua"
SELECTOR = {"app.kubernetes.io/name": "fibers", "app.kubernetes.io/instance": "rel"}  # release `rel`'s pods


# ----- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm from the Go module proxy, built into the cache on first use (tools/helm)."""
    return fetch.helm()


def run(argv: list[Any], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv[:3]))} … failed:\n{result.stdout}\n{result.stderr}")
    return result


def dry_run(kube: ApiClient, method: str, path: str, body: dict[str, Any], content_type: str) -> None:
    """A request with dryRun=All and fieldValidation=Strict: full server-side validation, nothing stored."""
    request = kube.param_serialize(
        method,
        path,
        query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = kube.call_api(*request)
    response.read()
    assert response.status < 300, (
        f"{method} {path}: {response.status} {(response.data or b'').decode(errors='replace')}"
    )


def dry_run_create(kube: ApiClient, doc: dict[str, Any]) -> None:
    resource = DynamicClient(kube).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    namespace = doc["metadata"].get("namespace") if resource.namespaced else None
    dry_run(kube, "POST", resource.path(namespace=namespace), doc, "application/json")


def served(kube: ApiClient, doc: dict[str, Any]) -> bool:
    try:
        DynamicClient(kube).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    except ResourceNotFoundError:
        return False
    return True


def new_namespace(kube: ApiClient, prefix: str, labels: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    meta = client.V1ObjectMeta(name=name, labels=labels)
    client.CoreV1Api(kube).create_namespace(client.V1Namespace(metadata=meta))
    return name


@pytest.fixture(scope="module")
def restricted_namespace(kube: ApiClient) -> Iterator[str]:
    """A second namespace, at the `restricted` Pod Security level."""
    name = new_namespace(kube, "chart", {"pod-security.kubernetes.io/enforce": "restricted"})
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


# ----- lint, schema, render ------------------------------------------------------------------------


def test_lint_in_both_modes(helm: Path) -> None:
    run([helm, "lint", "--strict", CHART])
    run([helm, "lint", "--strict", CHART, "--set", "watch.namespaces={team-a,team-b}", "--set", "standby.enabled=true"])


@pytest.mark.parametrize("bad", ["watch.namespace={a}", "connect.URL=http://x", "metrics.port=0", "logLevel=loud"])
def test_values_schema_refuses_typos_and_bad_values(helm: Path, bad: str) -> None:
    result = subprocess.run([helm, "template", "rel", CHART, "--set", bad], capture_output=True, text=True)
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_template_is_valid_for_the_real_apiserver(
    helm: Path, kube: ApiClient, restricted_namespace: str, tmp_path: Path, mode: str
) -> None:
    namespace = new_namespace(kube, "chart-plain")  # nothing of the chart in it yet (the test namespaces have)
    watched = [namespace, restricted_namespace] if mode == "namespaced" else []
    values = {
        "watch": {"namespaces": watched},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {}}]},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboards": {"enabled": True},
        },
        "standby": {"enabled": True},
        "logLevel": "debug",
        # What an umbrella chart and a platform's registry bring: every one must render to valid objects.
        "global": {"imageRegistry": "ignored.example"},
        "image": {"registry": "registry.example:5000/platform", "digest": "sha256:" + "a" * 64},
        "jobs": {
            "serviceAccount": {"namespaces": [namespace, restricted_namespace]},
            "image": {"registry": "registry.example:5000/platform", "tag": "1.2.3", "digest": "sha256:" + "b" * 64},
        },
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
    }
    docs = render_chart(helm, namespace, values, tmp_path)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "Service", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"} <= kinds
    assert "CustomResourceDefinition" not in kinds  # kopf's peering CRD is in crds/: never removed with us
    [budget] = by_kind(docs, "PodDisruptionBudget")  # a standby: a drain takes one operator pod at a time
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}}
    probes = {}
    for deployment in by_kind(docs, "Deployment"):
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example:5000/platform/fibers@sha256:" + "a" * 64
        env = {e["name"]: e.get("value") for e in container["env"]}
        # A tag set beside the digest stays in the reference for people; the digest decides what runs.
        assert env["FIBERS_JOB_IMAGE"] == "registry.example:5000/platform/fibers-job:1.2.3@sha256:" + "b" * 64
        assert env["FIBERS_ALLOWED_IMAGES"].split(",")[:2] == [
            "registry.example:5000/platform/fibers-job:",
            "registry.example:5000/platform/fibers-job@",
        ]
        assert env["HTTPS_PROXY"] == "http://proxy.example:3128"
        role = deployment["metadata"]["labels"]["fibers.dev/operator-role"]
        probes[role] = container["readinessProbe"]["httpGet"]["path"]
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert probes == {"active": "/readyz", "standby": "/readyz/standby"}
    # Every alert has a runbook, a section of docs/troubleshooting.md.
    [rule] = by_kind(docs, "PrometheusRule")
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in (REPO / "docs" / "troubleshooting.md").read_text().splitlines()
        if line.startswith("## ")
    }
    for alert in (r for group in rule["spec"]["groups"] for r in group["rules"]):
        base, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert base.endswith("/docs/troubleshooting.md") and anchor == alert["alert"].lower() in headings
    # The PodMonitor looks where the consumers run; the dashboards carry the sidecar's label.
    monitors = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "PodMonitor")}
    assert set(monitors) == {"rel-fibers-consumers", "rel-fibers-transforms"}
    for monitor in monitors.values():
        assert monitor["namespaceSelector"] == ({"matchNames": watched} if watched else {"any": True})
    dashboards = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert {json.loads(text)["uid"] for d in dashboards for text in d["data"].values()} == {
        "fibers-operator",
        "fibers-connect",
        "fibers-databus",
        "fibers-transform",
    }
    for deployment in by_kind(docs, "Deployment"):  # both peers know how long a silent one counts as alive
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "FIBERS_PEERING_LIFETIME", "value": "60"} in container["env"]

    # RBAC: the operator's rules are cluster-wide or per watched namespace, never both.
    roles = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in by_kind(docs, "Role")}
    operator_rules = "rel-fibers"
    if mode == "cluster-wide":
        [cluster_role] = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == operator_rules]
        assert any("connects/status" in r["resources"] for r in cluster_role["rules"])
        assert not any(name == operator_rules for _, name in roles)
    else:
        assert {(ns, operator_rules) for ns in watched} <= roles
        [cluster_read] = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "rel-fibers-cluster-read"]
        granted = {res for rule in cluster_read["rules"] for res in rule["resources"]}
        # Reads, and the status of ConnectClusters and SchemaRegistries (cluster-scoped): nothing namespaced.
        statuses = {"connectclusters/status", "schemaregistries/status"}
        assert granted == {"customresourcedefinitions", "namespaces", "connectclusters", "schemaregistries"} | statuses
        reads = {"get", "list", "watch"}
        assert all(set(r["verbs"]) <= reads for r in cluster_read["rules"] if not set(r["resources"]) & statuses)
        assert [r["verbs"] for r in cluster_read["rules"] if set(r["resources"]) & statuses] == [["patch"], ["patch"]]

    # What a namespace's users get through Kubernetes' own view/edit/admin: Fibers' kinds, never their status.
    aggregated = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole") if "aggregate" in str(d["metadata"])}
    assert set(aggregated) == {"rel-fibers-view", "rel-fibers-edit"}
    edit_rules = aggregated["rel-fibers-edit"]["rules"]
    assert not any("/" in res for rule in edit_rules for res in rule["resources"])
    assert "rbac.authorization.k8s.io/aggregate-to-edit" in aggregated["rel-fibers-edit"]["metadata"]["labels"]

    # The peering CRD must exist for its objects to validate: create it for real, briefly.
    ext = client.ApiextensionsV1Api(kube)
    plural = "kopfpeerings" if watched else "clusterkopfpeerings"
    peering_crd = yaml.safe_load((CHART / "crds" / f"{plural}.kopf.dev.yaml").read_text())
    crd_name = peering_crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(peering_crd)  # type: ignore[arg-type]  # a dict body is fine
    except ApiException as exc:
        if exc.status != 409:
            raise
    try:
        wait_for(
            lambda: served(kube, {"apiVersion": "kopf.dev/v1", "kind": peering_crd["spec"]["names"]["kind"]}),
            timeout=30,
            what=f"{crd_name} served",
        )
        # Every kind is served (the stack serves the Prometheus Operator's CRDs too), so every object
        # meets its real schema, the monitoring ones included.
        assert all(served(kube, d) for d in docs)
        for doc in docs:
            if doc["kind"] != "CustomResourceDefinition":
                dry_run_create(kube, doc)
    finally:
        ext.delete_custom_resource_definition(crd_name)

    # The pod itself passes the `restricted` Pod Security level (enforced on that namespace).
    for deployment in by_kind(docs, "Deployment"):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": deployment["metadata"]["name"], "namespace": restricted_namespace},
            # The chart's ServiceAccount exists in its release namespace only (the dry runs above
            # stored nothing); ServiceAccount admission wants one that exists.
            "spec": {**deployment["spec"]["template"]["spec"], "serviceAccountName": "default"},
        }
        dry_run_create(kube, pod)


def test_chart_crds_are_the_crds_directory() -> None:
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    sources = [*(REPO / "crds").glob("*.yaml"), *(REPO / "crds" / "kopf").glob("*.yaml")]
    source_crds = {p.name: p.read_bytes() for p in sources}
    stale = subprocess.run([sys.executable, REPO / "tools" / "sync_chart_crds.py", "--check"], capture_output=True)
    assert chart_crds == source_crds and stale.returncode == 0, (
        f"charts/fibers is out of date, run tools/sync_chart_crds.py:\n{stale.stdout.decode()}"
    )


def test_argocd_snippet_carries_the_health_check_for_each_kind() -> None:
    snippet = yaml.safe_load((CHART / "argocd" / "argocd-cm-values.yaml").read_text())["configs"]["cm"]
    script = HEALTH_LUA.read_text()
    health = {key: value for key, value in snippet.items() if key.startswith("resource.customizations.health.")}
    assert health == {
        **{
            f"resource.customizations.health.fibers.dev_{k}": script
            for k in ("Connect", "ConnectCluster", "Transform", "DatabusConsumer", "Schema", "SchemaRegistry", "Replay")
        },
        "resource.customizations.health.argoproj.io_Application": (
            CHART / "argocd" / "application-health.lua"
        ).read_text(),
    }
    # What the real Argo CD makes of the rest is tested in test_argocd.py.
    assert set(snippet) - set(health) == {
        "resource.customizations.ignoreResourceUpdates.all",
        "resource.compareoptions",
    }


def test_argocd_example_waves_and_manifests(helm: Path, kube: ApiClient, namespace: str, tmp_path: Path) -> None:
    """examples/argocd: operator before pipeline, Connect before what reads it; every manifest valid."""
    examples = REPO / "examples" / "argocd"

    def wave(doc: dict[str, Any]) -> int:
        return int(doc["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])

    apps = {
        d["metadata"]["name"]: d
        for f in sorted((examples / "apps").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
    }
    assert wave(apps["fibers-operator"]) < wave(apps["orders-pipeline"])
    assert apps["orders-pipeline"]["spec"]["source"]["path"] == "examples/argocd/pipeline"
    render_chart(helm, namespace, apps["fibers-operator"]["spec"]["source"]["helm"]["valuesObject"], tmp_path)  # schema
    pipeline = {
        d["kind"]: d for f in sorted((examples / "pipeline").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    }
    assert wave(pipeline["Connect"]) < wave(pipeline["Transform"]) == wave(pipeline["DatabusConsumer"])
    for doc in pipeline.values():
        dry_run_create(kube, {**doc, "metadata": {**doc["metadata"], "namespace": namespace}})


# ----- Argo CD health, in Lua 5.1 as Argo CD runs it ------------------------------------------------


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run health.lua the way Argo CD does: Lua 5.1, the object as global `obj`, a few safe libraries."""
    from lupa.lua51 import LuaRuntime

    lua = LuaRuntime(unpack_returned_tuples=True)

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            table = lua.table()
            for key, item in value.items():
                table[key] = to_lua(item)
            return table
        if isinstance(value, list):
            return lua.table_from([to_lua(item) for item in value])
        return value

    sandbox = lua.eval(
        "function(o) return {obj = o, ipairs = ipairs, pairs = pairs, type = type, tostring = tostring,"
        " tonumber = tonumber, table = table, string = string, math = math} end"
    )(to_lua(obj))
    run_in = lua.eval("function(src, env) local f = assert(loadstring(src)); setfenv(f, env); return f() end")
    result = run_in(HEALTH_LUA.read_text(), sandbox)
    return {str(k): str(v) for k, v in result.items()}


def test_every_status_fixture_has_an_expected_health() -> None:
    assert {p.stem for p in STATUS_FIXTURES.glob("*.json")} == set(HEALTH)


@pytest.mark.parametrize("name", sorted(HEALTH))
def test_argocd_health(name: str) -> None:
    status, fragment = HEALTH[name]
    health = argocd_health(status_fixture(name))
    assert health["status"] == status, health
    assert fragment in health["message"], health


def test_argocd_health_finished_batch_transform_without_ready_is_healthy() -> None:
    """A batch run that finished is done even when Ready is missing (e.g. written by an older operator)."""
    obj = status_fixture("transform-batch-succeeded")
    obj["status"]["conditions"] = [c for c in obj["status"]["conditions"] if c["type"] != "Ready"]
    assert argocd_health(obj)["status"] == "Healthy"
    obj["spec"]["mode"] = "streaming"
    assert argocd_health(obj)["status"] == "Progressing"


def test_status_fixtures_fit_the_crds(kube: ApiClient, namespace: str) -> None:
    """Each fixture's status, patched into a live object under strict field validation (dry run)."""
    custom = client.CustomObjectsApi(kube)
    plurals = {
        "Connect": "connects",
        "Transform": "transforms",
        "DatabusConsumer": "databusconsumers",
        "Schema": "schemas",
        "Replay": "replays",
    }
    for name in sorted(HEALTH):
        obj = status_fixture(name)
        if "status" not in obj:
            continue
        body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {"name": name}, "spec": obj["spec"]}
        if obj["kind"] == "ConnectCluster":  # cluster-scoped
            path = f"/apis/fibers.dev/v1beta1/connectclusters/{namespace}-{name}"
            body["metadata"]["name"] = f"{namespace}-{name}"
            custom.create_cluster_custom_object("fibers.dev", "v1beta1", "connectclusters", body)
            remove = partial(custom.delete_cluster_custom_object, "fibers.dev", "v1beta1", "connectclusters")
            created = f"{namespace}-{name}"
        else:
            plural = plurals[obj["kind"]]
            path = f"/apis/fibers.dev/v1beta1/namespaces/{namespace}/{plural}/{name}"
            custom.create_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, body)
            remove = partial(custom.delete_namespaced_custom_object, "fibers.dev", "v1beta1", namespace, plural)
            created = name
        try:
            dry_run(kube, "PATCH", f"{path}/status", {"status": obj["status"]}, "application/merge-patch+json")
        finally:
            remove(created)


# Each kind's spec, from the status fixtures (a SchemaRegistry has none): written through one version, read
# through the other.
VERSIONED = {
    "Connect": ("connects", status_fixture("connect-running")["spec"]),
    "ConnectCluster": ("connectclusters", status_fixture("connectcluster-ready")["spec"]),
    "DatabusConsumer": ("databusconsumers", status_fixture("databusconsumer-online")["spec"]),
    "Schema": ("schemas", status_fixture("schema-registered")["spec"]),
    "SchemaRegistry": ("schemaregistries", {"url": "http://registry.example:8080/apis/ccompat/v7"}),
    "Transform": ("transforms", status_fixture("transform-batch-succeeded")["spec"]),
    "Replay": ("replays", status_fixture("replay-succeeded")["spec"]),
}


def test_every_kind_reads_and_writes_through_both_versions(kube: ApiClient, namespace: str) -> None:
    """v1beta1 is stored; v1alpha1 is served beside it, deprecated: one object through either version, and
    the API server warns whoever still writes v1alpha1."""
    custom = client.CustomObjectsApi(kube)
    ext = client.ApiextensionsV1Api(kube)
    for kind, (plural, given) in VERSIONED.items():
        crd = ext.read_custom_resource_definition(f"{plural}.fibers.dev")
        versions = {v.name: v for v in crd.spec.versions}
        assert versions["v1beta1"].storage and versions["v1beta1"].served and not versions["v1beta1"].deprecated
        assert versions["v1alpha1"].served and versions["v1alpha1"].deprecated and not versions["v1alpha1"].storage
        cluster = crd.spec.scope == "Cluster"
        name = f"{namespace}-versions" if cluster else "versions"
        where: tuple[str, ...] = () if cluster else (namespace,)
        create = (
            custom.create_cluster_custom_object_with_http_info
            if cluster
            else (custom.create_namespaced_custom_object_with_http_info)
        )
        get = custom.get_cluster_custom_object if cluster else custom.get_namespaced_custom_object
        patch = custom.patch_cluster_custom_object if cluster else custom.patch_namespaced_custom_object
        delete = custom.delete_cluster_custom_object if cluster else custom.delete_namespaced_custom_object
        body = {"apiVersion": "fibers.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": given}
        written, _, headers = create("fibers.dev", "v1alpha1", *where, plural, body)
        spec = written["spec"]  # with the schema's defaults
        try:
            assert "deprecated" in headers.get("Warning", ""), (kind, headers)
            new = get("fibers.dev", "v1beta1", *where, plural, name)
            assert (new["apiVersion"], new["spec"]) == ("fibers.dev/v1beta1", spec), kind
            patch("fibers.dev", "v1beta1", *where, plural, name, {"metadata": {"labels": {"written": "v1beta1"}}})
            old = get("fibers.dev", "v1alpha1", *where, plural, name)
            assert old["apiVersion"] == "fibers.dev/v1alpha1" and old["spec"] == spec, kind
            assert old["metadata"]["labels"] == {"written": "v1beta1"}, kind
        finally:
            delete("fibers.dev", "v1beta1", *where, plural, name)


# ----- helm install, then the operator with exactly the chart's permissions ------------------------


class ChartOperator:
    """The operator as `helm install` runs it: a pod from the operator image, with the chart's RBAC."""

    def __init__(self, kube: ApiClient, namespace: str, release_namespace: str, release: str) -> None:
        self.core = client.CoreV1Api(kube)
        self.namespace, self.release_namespace = namespace, release_namespace
        self.selector = f"app.kubernetes.io/instance={release}"

    def pod(self) -> client.V1Pod:
        pods = self.core.list_namespaced_pod(self.release_namespace, label_selector=self.selector).items
        running = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        assert len(running) == 1, [(p.metadata.name, p.status.phase) for p in pods]
        return running[0]

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines, each with `text`: its message and any exception, for searching."""
        log = self.core.read_namespaced_pod_log(self.pod().metadata.name, self.release_namespace)
        lines = []
        for line in log.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = {"message": line}
            record["text"] = f"{record.get('message', '')}\n{record.get('exception', '')}"
            lines.append(record)
        return lines


@pytest.fixture(scope="module")
def release(
    helm: Path, kube: ApiClient, stack_info: StackInfo, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The chart installed from the stack's OCI registry, as a user installs it, in a namespace of its own,
    watching the test namespace."""
    home = tmp_path_factory.mktemp("chart")
    release_ns = new_namespace(kube, "fibers-system")
    name = f"fibers-{uuid.uuid4().hex[:5]}"
    values = stack_info.chart_values([namespace])
    values["connect"]["syncIntervalSeconds"] = 2
    values["jobs"]["serviceAccount"] = {"create": False}  # the test namespace has it already (same template)
    (home / "values.json").write_text(json.dumps(values))
    base = [helm, "--kubeconfig", stack_info.kubeconfig, "--namespace", release_ns]
    started = time.monotonic()
    chart = stack_info.chart_source()
    run([*base, "install", name, *chart, "--values", home / "values.json", "--wait", "--timeout", "3m"])
    installed = time.monotonic() - started
    docs = [d for d in yaml.safe_load_all(run([*base, "get", "manifest", name]).stdout) if d]
    yield {"name": name, "namespace": release_ns, "docs": docs, "home": home, "install_seconds": installed}
    run([*base, "uninstall", name])
    client.CoreV1Api(kube).delete_namespace(release_ns)


@pytest.fixture(scope="module")
def chart_operator(kube: ApiClient, namespace: str, release: dict[str, Any]) -> Iterator[ChartOperator]:
    op = ChartOperator(kube, namespace, release["namespace"], release["name"])
    yield op
    # Delete what the tests made while the operator runs, so its finalizers complete.
    custom = client.CustomObjectsApi(kube)

    def names(plural: str) -> list[str]:
        listing = cast(dict[str, Any], custom.list_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural))
        return [item["metadata"]["name"] for item in listing["items"]]

    def gone(plural: str) -> bool:
        return not names(plural)

    for plural in ("connects", "transforms", "schemas"):
        for name in names(plural):
            custom.delete_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, name)
        wait_for(partial(gone, plural), timeout=60, what=f"{plural} deleted by the chart's operator")


@pytest.fixture
def source_file(tmp_path: Path) -> Path:
    path = tmp_path / "source.txt"
    path.write_text("".join(f"record {i}\n" for i in range(3)))
    os.chmod(tmp_path, 0o755)  # Kafka Connect reads it
    return path


def test_the_installed_operator_is_ready_by_its_own_readyz(
    chart_operator: ChartOperator, release: dict[str, Any]
) -> None:
    """`helm install --wait` returned once the pod's readiness probe passed: /readyz, not a port that is open."""
    pod = chart_operator.pod()
    [container] = pod.spec.containers
    assert container.readiness_probe.http_get.path == "/readyz"
    assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    port = next(p.container_port for p in container.ports if p.name == "metrics")
    answer = httpx.get(f"http://{pod.status.pod_ip}:{port}/readyz", timeout=5)
    assert (answer.status_code, answer.json()) == (200, {"ready": True, "waiting": []})


def test_helm_upgrade_brings_the_crds_to_this_version_and_leaves_the_operator_running(
    helm: Path, kube: ApiClient, stack_info: StackInfo, chart_operator: ChartOperator, release: dict[str, Any]
) -> None:
    """Helm never upgrades crds/: the chart's pre-upgrade hook applies this version's CRDs from the image."""
    ext = client.ApiextensionsV1Api(kube)
    crd = "schemas.fibers.dev"
    alpha = [v.name for v in ext.read_custom_resource_definition(crd).spec.versions].index("v1alpha1")
    older = [{"op": "remove", "path": f"/spec/versions/{alpha}/deprecationWarning"}]  # as an older release had it
    ext.patch_custom_resource_definition(crd, older)  # a list: a JSON patch
    assert ext.read_custom_resource_definition(crd).spec.versions[alpha].deprecation_warning is None
    before = chart_operator.pod().metadata.uid
    base = [helm, "--kubeconfig", stack_info.kubeconfig, "--namespace", release["namespace"]]
    chart = stack_info.chart_source()
    run([*base, "upgrade", release["name"], *chart, "--reuse-values", "--wait", "--timeout", "3m"])
    assert "deprecated" in ext.read_custom_resource_definition(crd).spec.versions[alpha].deprecation_warning
    # The hook's Job and its rights are gone again; nothing of the operator changed, so it was not restarted.
    assert not client.BatchV1Api(kube).list_namespaced_job(release["namespace"]).items
    assert not [
        r
        for r in client.RbacAuthorizationV1Api(kube).list_cluster_role().items
        if r.metadata.name == f"{release['name']}-crds"
    ]
    assert chart_operator.pod().metadata.uid == before


def test_operator_with_the_chart_rbac_makes_a_connect_ready(
    chart_operator: ChartOperator,
    release: dict[str, Any],
    kube: ApiClient,
    stack_info: StackInfo,
    namespace: str,
    source_file: Path,
    unique: str,
) -> None:
    connects = Resources(kube, "connects", namespace)
    started = time.monotonic()
    # No spec.cluster: the ConnectCluster the chart made from connect.url is the operator's default.
    connects.create(unique, {"class": "FileStreamSource", "config": {"file": str(source_file), "topic": unique}})
    connects.wait_condition(unique, "True", "Running", timeout=90)
    [cluster] = by_kind(release["docs"], "ConnectCluster")
    assert cluster["spec"]["url"] == stack_info.connect_url
    assert connects.status(unique)["cluster"] == cluster["metadata"]["name"]
    custom = client.CustomObjectsApi(kube)
    probed = wait_for(
        lambda: (
            (
                s := custom.get_cluster_custom_object(
                    "fibers.dev", "v1beta1", "connectclusters", cluster["metadata"]["name"]
                ).get("status")
                or {}
            ).get("pluginCount")
            and s
        ),
        timeout=60,
        what="the chart's ConnectCluster probed by the chart's operator",
    )
    assert find(probed["conditions"], "Ready")["status"] == "True"
    ready = time.monotonic() - started
    print(f"\nhelm install {release['install_seconds']:.1f}s; Connect Ready {ready:.1f}s after creation")

    [service] = by_kind(release["docs"], "Service")
    port = service["spec"]["ports"][0]["port"]
    pod = chart_operator.pod()
    assert pod.spec.containers[0].image == stack_info.images["operator"]
    assert pod.spec.security_context.run_as_non_root is True
    # Through the Service, as Prometheus would scrape it (kube-proxy's rules on this host).
    cluster_ip = client.CoreV1Api(kube).read_namespaced_service(service["metadata"]["name"], release["namespace"])
    metrics_text = httpx.get(f"http://{cluster_ip.spec.cluster_ip}:{port}/metrics", timeout=5).text
    assert 'fibers_reconciles_total{kind="Connect"}' in metrics_text
    assert f'fibers_connector_state{{name="{unique}",namespace="{namespace}",state="RUNNING"}} 1.0' in metrics_text
    [deployment] = by_kind(release["docs"], "Deployment")
    health = next(
        p["containerPort"]
        for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        if p["name"] == "health"
    )
    assert httpx.get(f"http://{pod.status.pod_ip}:{health}/healthz", timeout=5).status_code == 200
    assert argocd_health(connects.get(unique)) == {"status": "Healthy", "message": "connector is RUNNING"}
    problems = [r["text"] for r in chart_operator.records() if "forbidden" in r["text"].lower()]
    problems += [r["text"] for r in chart_operator.records() if "not enough permissions" in r["text"].lower()]
    assert not problems, "the chart's RBAC is missing something the operator uses:\n" + "\n".join(problems)


def _without_patch_on(rules: list[dict[str, Any]], resource: str) -> list[dict[str, Any]]:
    """The rules, with `patch` on one fibers.dev resource taken away (its other verbs stay)."""
    narrowed = []
    for rule in rules:
        if resource in rule["resources"] and "patch" in rule["verbs"]:
            rest = [r for r in rule["resources"] if r != resource]
            if rest:
                narrowed.append({**rule, "resources": rest})
            if others := [v for v in rule["verbs"] if v != "patch"]:
                narrowed.append({**rule, "resources": [resource], "verbs": others})
        else:
            narrowed.append(rule)
    return narrowed


def test_operator_with_the_chart_rbac_registers_a_schema(
    chart_operator: ChartOperator, release: dict[str, Any], kube: ApiClient, namespace: str, unique: str
) -> None:
    """No spec.registry: the SchemaRegistry the chart made from schemaRegistry.url is the operator's default."""
    [registry] = by_kind(release["docs"], "SchemaRegistry")
    schemas = Resources(kube, "schemas", namespace)
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    schemas.create(unique, {"subject": f"{unique}-value", "schema": json.dumps(schema)})
    schemas.wait_condition(unique, "True", "Registered", timeout=60)
    assert schemas.status(unique)["registry"] == registry["metadata"]["name"]


@pytest.mark.parametrize(
    "denied_resource",
    [
        pytest.param("connects/status", id="status"),
        pytest.param("connects", id="claim"),
    ],
)
def test_without_a_permission_the_operator_says_so_and_leaves_no_orphan(
    chart_operator: ChartOperator,
    release: dict[str, Any],
    kube: ApiClient,
    connect_http: httpx.Client,
    namespace: str,
    source_file: Path,
    unique: str,
    denied_resource: str,
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube)
    [role_name] = [
        d["metadata"]["name"]
        for d in by_kind(release["docs"], "Role")
        if any("connects/status" in rule["resources"] for rule in d["rules"])
    ]
    original = kube.sanitize_for_serialization(rbac.read_namespaced_role(role_name, namespace))
    narrowed = {**original, "rules": _without_patch_on(original["rules"], denied_resource)}
    rbac.replace_namespaced_role(role_name, namespace, narrowed)
    connects = Resources(kube, "connects", namespace)
    try:
        connects.create(unique, {"class": "FileStreamSource", "config": {"file": str(source_file), "topic": unique}})
        # The API server's own words, in the operator's log line.
        denied = ("Forbidden", "cannot patch resource", f'"{denied_resource}"', namespace)
        [record] = wait_for(
            lambda: [r for r in chart_operator.records() if all(d in r["text"] for d in denied)][:1],
            timeout=30,
            what="the operator to log the denied write",
        )
        assert "forbidden" in record["text"] and record["level"] in ("error", "warning"), record
        time.sleep(3)  # a few more sync rounds
        meta = connects.get(unique)["metadata"]
        if denied_resource == "connects":
            # The claim is written before the connector is created: without it, no connector.
            cond = connects.wait_condition(unique, "False", "ClaimFailed")
            assert "forbidden" in cond["message"].lower()
            assert connect_http.get(f"/connectors/{unique}").status_code == 404
            assert ANNOTATION_OWNED_CONNECTOR not in (meta.get("annotations") or {})
        else:
            assert connects.condition(unique) == {}, "no status is written, so no Ready condition either"
            # Claimed first, so the connector made meanwhile is one the resource owns and deletes.
            assert connect_http.get(f"/connectors/{unique}").status_code == 200
            assert meta["annotations"][ANNOTATION_OWNED_CONNECTOR] == unique
            assert CONNECT_FINALIZER in meta["finalizers"]
    finally:
        original["metadata"].pop("resourceVersion", None)
        rbac.replace_namespaced_role(role_name, namespace, original)
    # With the permission back, the same operator process catches up on its own.
    connects.wait_condition(unique, "True", "Running", timeout=60)


def test_operator_with_the_chart_rbac_runs_a_batch_transform(
    chart_operator: ChartOperator, kube: ApiClient, namespace: str, stack_info: StackInfo, unique: str
) -> None:
    """SparkApplications the real Spark Operator runs (driver and executor pods), and result ConfigMaps."""
    log_start = len(chart_operator.records())
    produce(stack_info.kafka_bootstrap, f"{unique}-in", [{"id": i} for i in range(4)], key="id")
    transforms = Resources(kube, "transforms", namespace)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "things", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT"}}],
            "sql": "SELECT count(*) AS n FROM things",
            "output": {"kafka": {"topic": f"{unique}-out"}},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    assert [json.loads(v) for v in read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 1)] == [{"n": 4}]
    assert transforms.status(unique)["currentRun"]["recordsOut"] == 1  # from the result ConfigMap
    assert argocd_health(transforms.get(unique))["status"] == "Healthy"
    assert not [r["text"] for r in chart_operator.records()[log_start:] if "forbidden" in r["text"].lower()]


def test_the_chart_policy_refuses_images_service_accounts_and_spark_settings_it_does_not_allow(
    chart_operator: ChartOperator, kube: ApiClient, namespace: str, unique: str
) -> None:
    """Creating a consumer or a Transform makes the operator create pods with its own rights: what the
    platform team did not allow (policy.*) is refused before anything is created, naming the field."""
    consumers, transforms = Resources(kube, "databusconsumers", namespace), Resources(kube, "transforms", namespace)
    consumer = {"sources": ["t"], "sink": {"type": "log"}}
    consumers.create(f"{unique}-img", {**consumer, "image": "registry.evil.example/miner:1"})
    consumers.create(f"{unique}-sa", {**consumer, "serviceAccount": "default"})
    transforms.create(
        f"{unique}-conf",
        {
            "inputs": [{"name": "t", "kafka": {"topics": ["t"], "schema": "id INT"}}],
            "sql": "SELECT * FROM t",
            "output": {"kafka": {"topic": f"{unique}-out"}},
            "spark": {"sparkConf": {"spark.kubernetes.namespace": "kube-system"}},
        },
    )
    refused = {
        (consumers, f"{unique}-img"): "spec.image: image registry.evil.example/miner:1 is not allowed",
        (consumers, f"{unique}-sa"): "spec.serviceAccount: ServiceAccount default is not allowed",
        (transforms, f"{unique}-conf"): "spec.spark.sparkConf.spark.kubernetes.namespace:",
    }
    for (resources, name), message in refused.items():
        cond = resources.wait_condition(name, "False", "InvalidSpec", timeout=60)
        assert message in cond["message"], cond
    apps = client.AppsV1Api(kube)
    for name in (f"{unique}-img", f"{unique}-sa"):
        selector = f"fibers.dev/databusconsumer={name}"
        assert not apps.list_namespaced_stateful_set(namespace, label_selector=selector).items
    assert spark_apps(kube, namespace, f"{unique}-conf") == []
    for name in (f"{unique}-img", f"{unique}-sa"):  # while the chart's operator runs: it holds their finalizers
        consumers.delete(name)
        wait_for(lambda name=name: not consumers.exists(name), timeout=30, what="the consumer gone")


# kube-score's findings the chart declines, each on purpose; any other finding fails the test.
KUBE_SCORE_DECLINED = {
    # Images are pinned by digest (values image.digest): Always would only add a registry round trip to
    # every start and make a restart depend on the registry.
    "container-image-pull-policy": "pinned by digest",
    # A CPU limit throttles kopf's event loop under a burst of events; requests are set, and a platform
    # that wants limits sets resources.limits.
    "container-resources": "CPU limit left to resources.limits",
    # Container logs count toward ephemeral storage: a default limit would evict a chatty operator. Set
    # through resources when a platform requires it.
    "container-ephemeral-storage-request-and-limit": "left to resources",
    # One active operator by design (kopf acts from one process; standby.enabled adds a passive one).
    "deployment-replicas": "one active operator",
    # Recreate, so that two versions never act at once during a rollout.
    "deployment-strategy": "Recreate on purpose",
}


def test_kube_score_finds_nothing_but_what_the_chart_declines(helm: Path, tmp_path: Path) -> None:
    """A third-party check (kube-score, built from its module) over the chart as a platform runs it: a
    standby, the NetworkPolicy, the CRD-upgrade and release hooks. No probe finding at all (each workload has distinct
    readiness and liveness probes, on real endpoints); every other finding is one KUBE_SCORE_DECLINED names."""
    values = {"watch": {"namespaces": ["team-a"]}, "standby": {"enabled": True}, "networkPolicy": {"enabled": True}}
    docs = render_chart(helm, "fibers-system", values, tmp_path)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    scored = subprocess.run(
        [str(fetch.kube_score()), "score", "--output-format", "json", str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = json.loads(scored.stdout)
    workloads = {r["object_name"] for r in results if r["type_meta"]["kind"] in ("Deployment", "Job")}
    assert len(workloads) == 4, workloads  # the operator, the standby, the hooks' Jobs (CRDs, release)
    findings = {
        (r["object_name"], c["check"]["id"])
        for r in results
        for c in r["checks"]
        if not c["skipped"] and c["grade"] < 10  # kube-score's "OK" grade
    }
    assert not {f for f in findings if f[1].startswith("pod-probes")}, findings
    assert {check for _, check in findings} <= set(KUBE_SCORE_DECLINED), findings
