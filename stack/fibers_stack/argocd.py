"""A real Argo CD v3 next to the stack, for the GitOps tests: application-controller, repo-server and Redis.

Off unless asked: `ensure(info)` starts it on the running stack (about 15 s once built) and records
its processes in stack.json, so `fibers-stack down` stops them with the rest. There is no
argocd-server (no UI, no API): tests create Applications with kubectl like any other resource, and
read health and sync state from their status.

What argocd-server would otherwise do is done here before the controller starts (see
../shared/notes/argocd.md for why each is needed): the `default` AppProject, `server.secretkey` in
argocd-secret, and argocd-cm written completely (the controller drops its cluster cache when
argocd-cm changes under it). argocd-cm is Argo CD's own default plus the Fibers chart's snippet
(`charts/fibers/argocd/argocd-cm-values.yaml`), unchanged, so the tests run what users are told
to install. The controller runs in Argo CD's "fake in-cluster" mode: the in-cluster destination
`https://kubernetes.default.svc` is the stack's API server through $KUBECONFIG. Every listener is
on loopback (the controller's metrics port through the recipe's patch, see fetch.argocd).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

import fibers_stack as stack
from fibers_stack import crds, fetch, process
from fibers_stack.launcher import Launcher
from fibers_stack.layout import REPO_ROOT, argocd_module

log = logging.getLogger("fibers_stack.argocd")

NAMESPACE = "argocd"
GROUP, VERSION = "argoproj.io", "v1alpha1"
SNIPPET = REPO_ROOT / "charts" / "fibers" / "argocd" / "argocd-cm-values.yaml"
PROCESSES = ("argocd-redis", "argocd-repo-server", "argocd-application-controller")
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ArgoCD:
    namespace: str
    kubeconfig: str


def snippet_cm() -> dict[str, str]:
    """The argocd-cm keys the chart's snippet gives (its `configs.cm`, as the argo-cd Helm chart takes them)."""
    values = yaml.safe_load(SNIPPET.read_text())
    return {str(key): str(value) for key, value in values["configs"]["cm"].items()}


def argocd_cm() -> dict[str, str]:
    """Argo CD's default argocd-cm data with the chart's snippet over it."""
    default = yaml.safe_load((argocd_module() / "manifests" / "base" / "config" / "argocd-cm.yaml").read_text())
    return {**default.get("data", {}), **snippet_cm()}


def running(info: stack.StackInfo) -> bool:
    return all(name in info.pids and process.alive(info.pids[name]) for name in PROCESSES)


def ensure(info: stack.StackInfo) -> ArgoCD:
    """Argo CD on the running stack: started (and recorded for `down`) unless it already runs."""
    found = ArgoCD(NAMESPACE, info.kubeconfig)
    if running(info):
        return found
    binary, helm = fetch.argocd(), fetch.helm()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    try:
        _install(api)
    finally:
        api.close()
    root = Path(info.run_dir) / "argocd"
    shutil.rmtree(root, ignore_errors=True)
    (root / "tmp").mkdir(parents=True)
    for name in PROCESSES[1:]:  # one binary: it is the component its name says
        (root / name).symlink_to(binary)
    launcher = Launcher(Path(info.run_dir))
    redis_port = process.free_port(LOOPBACK)
    redis = f"{LOOPBACK}:{redis_port}"
    launcher.spawn(
        "argocd-redis",
        [_redis(), "--bind", LOOPBACK, "--port", str(redis_port), "--save", "", "--appendonly", "no"],
    )
    launcher.wait("argocd-redis", lambda: process.port_open(redis_port, LOOPBACK), timeout=30)
    repo_port, repo_metrics = process.free_port(LOOPBACK), process.free_port(LOOPBACK)
    launcher.spawn(
        "argocd-repo-server",
        [
            str(root / "argocd-repo-server"),
            "--address",
            LOOPBACK,
            "--port",
            str(repo_port),
            "--metrics-address",
            LOOPBACK,
            "--metrics-port",
            str(repo_metrics),
            "--disable-tls",
            "--redis",
            redis,
        ],
        env={
            "ARGOCD_GPG_ENABLED": "false",  # else it sets up a GnuPG keyring under /app/config/gpg
            "ARGOCD_ASK_PASS_SOCK": str(root / "askpass.sock"),
            "TMPDIR": str(root / "tmp"),  # repository clones go under $TMPDIR/_argocd-repo
            "PATH": f"{helm.parent}:/usr/local/bin:/usr/bin:/bin",  # helm renders the chart, git clones
        },
    )
    controller_metrics = process.free_port(LOOPBACK)
    launcher.spawn(
        "argocd-application-controller",
        [
            str(root / "argocd-application-controller"),
            "--kubeconfig",
            info.kubeconfig,
            "--namespace",
            NAMESPACE,
            "--repo-server",
            f"{LOOPBACK}:{repo_port}",
            "--repo-server-plaintext",
            "--redis",
            redis,
            "--metrics-port",
            str(controller_metrics),
            "--persist-resource-health",  # v3 keeps per-resource health only in Redis otherwise
            "--status-processors",
            "2",
            "--operation-processors",
            "2",
        ],
        env={"ARGOCD_FAKE_IN_CLUSTER": "true", "KUBECONFIG": info.kubeconfig},
    )
    for name, port in (("argocd-repo-server", repo_metrics), ("argocd-application-controller", controller_metrics)):
        launcher.wait(name, lambda port=port: _healthy(port), timeout=60)  # type: ignore[misc]
    for name, pid in launcher.pids.items():
        stack.adopt_process(name, pid, launcher.commands[name]["argv"])
    log.info("argocd ready", extra={"namespace": NAMESPACE, "logs": str(launcher.log_dir)})
    return found


def _redis() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is missing: `make system-packages` installs Debian's redis-server")
    return found


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/healthz", timeout=2) as answer:
        return bool(answer.status == 200)


def _install(api: client.ApiClient) -> None:
    """Argo CD's CRDs, its namespace and the configuration argocd-server would otherwise have made."""
    manifests = argocd_module() / "manifests" / "crds"
    crds.apply(api, paths=[manifests / "application-crd.yaml", manifests / "appproject-crd.yaml"], timeout=60)
    core = client.CoreV1Api(api)
    _create_or_replace(core, "namespace", client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    labels = {"app.kubernetes.io/part-of": "argocd"}
    for name, data in (("argocd-cm", argocd_cm()), ("argocd-rbac-cm", {})):
        meta = client.V1ObjectMeta(name=name, labels={**labels, "app.kubernetes.io/name": name})
        _create_or_replace(core, "config_map", client.V1ConfigMap(metadata=meta, data=data))
    meta = client.V1ObjectMeta(name="argocd-secret", labels={**labels, "app.kubernetes.io/name": "argocd-secret"})
    secret = client.V1Secret(metadata=meta, string_data={"server.secretkey": secrets.token_urlsafe(32)})
    _create_or_replace(core, "secret", secret)
    project = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AppProject",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        },
    }
    custom = client.CustomObjectsApi(api)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "appprojects", project)
    except ApiException as exc:
        if exc.status != 409:
            raise


def _create_or_replace(core: client.CoreV1Api, kind: str, body: Any) -> None:
    """Create a namespace, or a ConfigMap or Secret in NAMESPACE, replacing what an earlier start left."""
    namespaced = kind != "namespace"
    args = (NAMESPACE, body) if namespaced else (body,)
    try:
        getattr(core, f"create_{'namespaced_' if namespaced else ''}{kind}")(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise
        if namespaced:
            getattr(core, f"replace_namespaced_{kind}")(body.metadata.name, NAMESPACE, body)
