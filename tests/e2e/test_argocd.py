"""GitOps for real: a real Argo CD syncs Fibers and a pipeline from git, on the real node.

Argo CD v3 (application-controller, repo-server, Redis; see fibers_stack.argocd) reads a local git
repository holding `examples/argocd` and `charts/fibers`, edited only where a user edits them: the
repository URL, the operator's endpoints and images, and names unique to this run. argocd-cm is
Argo CD's default plus the chart's snippet (`charts/fibers/argocd/argocd-cm-values.yaml`) as shipped.

The app of apps installs the operator from the chart (wave 0), then the pipeline: the Connect (wave
1), then the Transform and the DatabusConsumer (wave 2), with real pods. Then, by commits: pause,
a broken connector config holding the next wave, the revert, a prune; and by hand: an edit that
self-heal undoes, operator restarts and offset resets. A witness watches both Applications
throughout: outside the moments a commit or a hand edit makes them differ from git, they must stay
Synced — nothing the operator writes (status, finalizers, annotations, children) may be a diff.
"""

from __future__ import annotations

import contextlib
import copy
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

import fibers_stack
from fibers_stack import StackInfo, argocd, spark_operator, yamlout
from fibers_stack.layout import REPO_ROOT
from tests.helpers import HEALTH, status_fixture, wait_for

GROUP, VERSION = argocd.GROUP, argocd.VERSION
# Whichever test runs first pays for the module's set-up (Argo CD started, the operator and the pipeline
# synced in waves): together more than the suite's 600 s per test on a cold machine, each wait bounded itself.
pytestmark = pytest.mark.timeout(1800)

FIBERS = ("fibers.dev", "v1beta1")
PLURALS = {"Connect": "connects", "Transform": "transforms", "DatabusConsumer": "databusconsumers", "Schema": "schemas"}
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "status"


# ----- git and Argo CD ------------------------------------------------------------------------------


class Repo:
    """A bare git repository (what Argo CD reads, over file://) and a work tree to commit from."""

    def __init__(self, root: Path) -> None:
        self.bare, self.work = root / "fibers.git", root / "work"
        self._git(root, "init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        self._git(root, "init", "--quiet", "--initial-branch=main", str(self.work))
        self._git(self.work, "remote", "add", "origin", str(self.bare))

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def _git(self, cwd: Path, *args: str) -> str:
        argv = ["git", "-c", "user.name=test", "-c", "user.email=test@fibers.dev", *args]
        return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    def path(self, rel: str) -> Path:
        return self.work / rel

    def read(self, rel: str) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load(self.path(rel).read_text())
        return loaded

    def write(self, rel: str, doc: dict[str, Any]) -> None:
        self.path(rel).parent.mkdir(parents=True, exist_ok=True)
        self.path(rel).write_text(yamlout.dump(doc, sort_keys=False))

    def remove(self, rel: str) -> None:
        self.path(rel).unlink()

    def commit(self, message: str) -> str:
        self._git(self.work, "add", "--all")
        self._git(self.work, "commit", "--quiet", "-m", message)
        self._git(self.work, "push", "--quiet", "origin", "main")
        return self._git(self.work, "rev-parse", "HEAD")


class Argo:
    """Applications as Argo CD reports them (there is no argocd-server here: the API server is the API)."""

    def __init__(self, kube: ApiClient) -> None:
        self.custom = client.CustomObjectsApi(kube)

    def apply(self, app: dict[str, Any]) -> None:
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, argocd.NAMESPACE, "applications", app)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, argocd.NAMESPACE, "applications", app["metadata"]["name"], {"spec": app["spec"]}
            )

    def get(self, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, argocd.NAMESPACE, "applications", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return found

    def refresh(self, *names: str) -> None:
        """What a git webhook or `argocd app get --refresh` does: look at git now, not at the next poll."""
        for name in names:
            patch = {"metadata": {"annotations": {"argocd.argoproj.io/refresh": "normal"}}}
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, argocd.NAMESPACE, "applications", name, patch)

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, argocd.NAMESPACE, "applications", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def health(self, app: str, kind: str, name: str) -> tuple[str, str]:
        """One resource's health as the Application reports it: (status, message); ("", "") if not listed."""
        for res in self.get(app).get("status", {}).get("resources") or []:
            if res.get("kind") == kind and res.get("name") == name:
                health = res.get("health") or {}
                return str(health.get("status", "")), str(health.get("message", ""))
        return "", ""

    def wait_health(self, app: str, kind: str, name: str, status: str, fragment: str = "", timeout: float = 60) -> str:
        def probe() -> str | None:
            found, message = self.health(app, kind, name)
            return message or "-" if found == status and fragment in message else None

        return wait_for(probe, timeout=timeout, what=f"Argo CD: {app} {kind}/{name} {status} {fragment!r}")

    def synced_to(self, name: str, revision: str) -> bool:
        sync = self.get(name).get("status", {}).get("sync") or {}
        return bool(sync.get("status") == "Synced" and sync.get("revision") == revision)

    def wait_synced(self, revision: str, *names: str, timeout: float = 60) -> None:
        self.refresh(*names)
        for name in names:
            wait_for(lambda n=name: self.synced_to(n, revision), timeout=timeout, what=f"{name} Synced at {revision}")  # type: ignore[misc]


@dataclass
class Witness:
    """Watches Applications' sync status in the background; OutOfSync outside an expected change is a finding."""

    argo: Argo
    apps: tuple[str, ...]
    findings: list[str] = field(default_factory=list)
    looks: int = 0  # Application reads outside expected changes: the witness did watch
    _expected: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _started: bool = False

    def start(self) -> None:
        """Start watching (once: a second call does nothing)."""
        if not self._started:
            self._started = True
            threading.Thread(target=self._run, daemon=True, name="argocd-witness").start()

    def stop(self) -> None:
        self._stop.set()

    @contextmanager
    def change(self) -> Iterator[None]:
        """A change of git or of the live state on purpose: differences are expected until it is synced."""
        self._expected += 1
        try:
            yield
        finally:
            self._expected -= 1

    def wait_looked(self, since: int) -> None:
        """Until it has read the Applications outside an expected change since `since` (a test's own look)."""
        wait_for(lambda: self.looks > since, timeout=60, what="the witness looking outside expected changes")

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            if self._expected:
                continue
            for name in self.apps:
                try:
                    status = self.argo.get(name).get("status") or {}
                except Exception:  # a transient API error is not a finding
                    continue
                self.looks += 1
                drifted = [
                    f"{r.get('kind')}/{r.get('name')}"
                    for r in status.get("resources") or []
                    if r.get("status") == "OutOfSync"
                ]
                # Checked again: a change may have begun while the Application was being read.
                if not self._expected and (status.get("sync") or {}).get("status") != "Synced":
                    self.findings.append(f"{time.strftime('%H:%M:%S')} {name} OutOfSync: {drifted}")


# ----- the pipeline from git -------------------------------------------------------------------------


@dataclass
class GitOps:
    argo: Argo
    repo: Repo
    witness: Witness
    namespace: str  # the pipeline's
    system: str  # the operator's
    table: str
    custom: client.CustomObjectsApi
    core: client.CoreV1Api
    connect: httpx.Client
    # When each wave's prerequisite held and the next wave was made, read once all was synced (later tests
    # restart the operator and send the Connect through Degraded, which moves these times on).
    waves: dict[str, str] = field(default_factory=dict)

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                *FIBERS, self.namespace, PLURALS[kind], name
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return found

    def commit(self, message: str, *apps: str, timeout: float = 60) -> str:
        """Commit, tell Argo CD, and wait until the Applications are synced to it."""
        with self.witness.change():
            revision = self.repo.commit(message)
            self.argo.wait_synced(revision, *(apps or ("orders-pipeline",)), timeout=timeout)
        return revision


def _pipeline_docs(repo: Repo, gitops_ns: str, table: str) -> None:
    """examples/argocd/pipeline, as this run needs it: its own table, slot, topics and checkpoint volume."""
    connect = repo.read("examples/argocd/pipeline/1-connect.yaml")
    connect["spec"]["connectorName"] = table  # one Kafka Connect serves every test and the demo
    connect["spec"]["config"].update(
        {
            "topic.prefix": table,
            "table.include.list": f"public.{table}",
            "slot.name": table,
            "publication.name": table,
        }
    )
    repo.write("examples/argocd/pipeline/1-connect.yaml", connect)
    transform = repo.read("examples/argocd/pipeline/2-transform.yaml")
    transform["spec"]["output"]["kafka"]["topic"] = f"{table}.by-item"
    transform["spec"]["checkpoint"]["location"] = f"/data/{table}/checkpoint"
    transform["spec"]["spark"] = {  # no object store here: a directory on the node, as the demo does
        "volumes": [
            {"name": "data", "hostPath": {"path": f"/tmp/fibers-argocd/{gitops_ns}", "type": "DirectoryOrCreate"}}
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    repo.write("examples/argocd/pipeline/2-transform.yaml", transform)
    consumer = repo.read("examples/argocd/pipeline/2-databusconsumer.yaml")
    consumer["spec"]["sink"]["database"] = table
    repo.write("examples/argocd/pipeline/2-databusconsumer.yaml", consumer)


def _point_apps_at(repo: Repo, stack_info: StackInfo, gitops_ns: str, system_ns: str) -> dict[str, Any]:
    """The Applications' repoURL, namespaces and the operator's values (this stack's endpoints and images)."""
    root = repo.read("examples/argocd/application.yaml")
    root["spec"]["source"]["repoURL"] = repo.url
    operator = repo.read("examples/argocd/apps/operator.yaml")
    operator["spec"]["source"]["repoURL"] = repo.url
    operator["spec"]["destination"]["namespace"] = system_ns
    values = stack_info.chart_values([gitops_ns])
    values["connect"]["syncIntervalSeconds"] = 2
    values["jobs"]["serviceAccount"] = {"create": True}
    # The stack's servers and images over the example's; what else the example sets (uninstall) stays.
    helm = operator["spec"]["source"]["helm"]
    helm["valuesObject"] = {**helm["valuesObject"], **values}
    repo.write("examples/argocd/apps/operator.yaml", operator)
    pipeline = repo.read("examples/argocd/apps/pipeline.yaml")
    pipeline["spec"]["source"]["repoURL"] = repo.url
    pipeline["spec"]["destination"]["namespace"] = gitops_ns
    repo.write("examples/argocd/apps/pipeline.yaml", pipeline)
    return root


@pytest.fixture(scope="module")
def argo(stack_info: StackInfo, kube: ApiClient) -> Argo:
    argocd.ensure(stack_info)
    return Argo(kube)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return Repo(tmp_path_factory.mktemp("gitops"))


@pytest.fixture(scope="module")
def installed(
    argo: Argo,
    repo: Repo,
    kube: ApiClient,
    stack_info: StackInfo,
    crds: None,
    connect_http: httpx.Client,
) -> Iterator[GitOps]:
    run = uuid.uuid4().hex[:6]
    gitops_ns, system_ns, table = f"gitops-{run}", f"gitops-{run}-system", f"gitops_{run}"
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    # What the platform team provides, outside git: the namespace the Spark Operator watches, the Secrets.
    labels = {spark_operator.JOB_NAMESPACE_LABEL: "enabled"}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=gitops_ns, labels=labels)))
    dsn = psycopg.conninfo.conninfo_to_dict(stack_info.postgres_dsn)
    db = {
        "host": str(dsn["host"]),
        "port": str(dsn["port"]),
        "user": str(dsn["user"]),
        "password": str(dsn.get("password") or ""),
    }
    core.create_namespaced_secret(
        gitops_ns, client.V1Secret(metadata=client.V1ObjectMeta(name="shop-db"), string_data=db)
    )
    mongo = client.V1Secret(
        metadata=client.V1ObjectMeta(name="shop-mongo"), string_data={"uri": stack_info.mongodb_uri}
    )
    core.create_namespaced_secret(gitops_ns, mongo)
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE public.{table} (id INT PRIMARY KEY, item TEXT, qty INT, price DOUBLE PRECISION)")
        pg.execute(f"INSERT INTO public.{table} VALUES (1, 'pen', 2, 1.5), (2, 'ink', 1, 4.0)")

    shutil.copytree(REPO_ROOT / "examples" / "argocd", repo.path("examples/argocd"))
    shutil.copytree(REPO_ROOT / "charts" / "fibers", repo.path("charts/fibers"))
    root = _point_apps_at(repo, stack_info, gitops_ns, system_ns)
    _pipeline_docs(repo, gitops_ns, table)
    witness = Witness(argo, ("fibers-operator", "orders-pipeline"))
    ops = GitOps(argo, repo, witness, gitops_ns, system_ns, table, custom, core, connect_http)
    with witness.change():
        repo.commit("the operator and the orders pipeline")
        argo.apply(root)
    yield ops
    witness.stop()
    _uninstall(ops, kube)


@pytest.fixture(scope="module")
def gitops(installed: GitOps, kube: ApiClient) -> GitOps:
    """The pipeline from git, every Application Healthy and Synced, its waves' times read, and the witness
    watching from then on: whichever test runs first (each can run alone; none relies on another)."""
    argo = installed.argo
    _wait_healthy_and_synced(argo, "fibers-root", timeout=900)
    # The root's last wave is the pipeline's Application: the root is done once it is created.
    for app in ("fibers-operator", "orders-pipeline"):
        _wait_healthy_and_synced(argo, app, timeout=600)
    deployment = client.AppsV1Api(kube).read_namespaced_deployment("fibers-operator", installed.system)
    available = next(c for c in deployment.status.conditions if c.type == "Available")
    installed.waves = {
        "operator available": available.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pipeline created": argo.get("orders-pipeline")["metadata"]["creationTimestamp"],
        "connect ready": _condition(installed.resource("Connect", "orders-cdc"), "Ready")["lastTransitionTime"],
        **{
            f"{kind} created": installed.resource(kind, name)["metadata"]["creationTimestamp"]
            for kind, name in (("Transform", "orders-by-item"), ("DatabusConsumer", "orders-view"))
        },
    }
    installed.witness.start()
    return installed


def _uninstall(ops: GitOps, kube: ApiClient) -> None:
    """Stop Argo CD managing (the Applications have no cascade finalizer: deleting them leaves resources),
    delete the pipeline while its operator still runs (so connectors go), then the operator's release."""
    for app in ("fibers-root", "orders-pipeline", "fibers-operator"):
        ops.argo.delete(app)
    wait_for(
        lambda: not any(ops.argo.get(a) for a in ("fibers-root", "orders-pipeline", "fibers-operator")),
        timeout=60,
        what="Applications gone",
    )
    for plural in PLURALS.values():
        for item in ops.custom.list_namespaced_custom_object(*FIBERS, ops.namespace, plural)["items"]:
            ops.custom.delete_namespaced_custom_object(*FIBERS, ops.namespace, plural, item["metadata"]["name"])

    def pipeline_gone() -> bool:
        return not any(
            ops.custom.list_namespaced_custom_object(*FIBERS, ops.namespace, p)["items"] for p in PLURALS.values()
        )

    wait_for(pipeline_gone, timeout=120, what="the pipeline's resources deleted by the operator")
    for ns in (ops.namespace, ops.system):
        ops.core.delete_namespace(ns)
    instance = "app.kubernetes.io/instance=fibers-operator"
    rbac = client.RbacAuthorizationV1Api(kube)
    for binding in rbac.list_cluster_role_binding(label_selector=instance).items:
        rbac.delete_cluster_role_binding(binding.metadata.name)
    for role in rbac.list_cluster_role(label_selector=instance).items:
        rbac.delete_cluster_role(role.metadata.name)
    for plural in ("connectclusters", "schemaregistries"):
        for item in ops.custom.list_cluster_custom_object(*FIBERS, plural, label_selector=instance)["items"]:
            ops.custom.delete_cluster_custom_object(*FIBERS, plural, item["metadata"]["name"])


# ----- the tests (each can run alone, in any order) ------------------------------------------------


def test_argocd_listens_on_loopback_only(argo: Argo, stack_info: StackInfo) -> None:
    """The controller's metrics port is on every interface in Argo CD's code: the stack's build patches it."""
    current = fibers_stack.current()
    assert current is not None
    pids = {str(current.pids[name]) for name in argocd.PROCESSES}
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    ours = [line.split() for line in listening if any(f"pid={pid}," in line for pid in pids)]
    assert {f"pid={pid}," for pid in pids} <= {part for line in ours for part in re.findall(r"pid=\d+,", line[-1])}
    assert len(ours) >= 4 and all(fields[3].startswith("127.0.0.1:") for fields in ours), ours


# Status changes that keep the health but change its message: with Argo CD's defaults these showed only
# at its next periodic refresh (up to 3 minutes); the chart's snippet makes them show at once.
SAME_HEALTH_NEXT = {
    "connect-tasks-failed": "connect-not-owned",
    "connect-unreachable": "connect-generation-behind",
    "transform-run-failed": "transform-deadline",
    "databusconsumer-checkpoint-invalid": "databusconsumer-failing",
}
NAMESPACED = ("Connect", "Transform", "DatabusConsumer", "Schema")


def _write_status(custom: client.CustomObjectsApi, namespace: str, name: str, fixture: dict[str, Any]) -> None:
    """The fixture's status onto the live object, its observedGeneration as far behind as the fixture's."""
    live = custom.get_namespaced_custom_object(*FIBERS, namespace, PLURALS[fixture["kind"]], name)
    status = copy.deepcopy(fixture.get("status") or {})
    if "observedGeneration" in status:
        behind = int(fixture["metadata"].get("generation", 1)) - int(status["observedGeneration"])
        status["observedGeneration"] = int(live["metadata"]["generation"]) - behind
    live["status"] = status
    custom.replace_namespaced_custom_object_status(*FIBERS, namespace, PLURALS[fixture["kind"]], name, live)


def test_the_charts_health_checks_in_real_argocd(argo: Argo, repo: Repo, kube: ApiClient, crds: None) -> None:
    """Every status fixture through the snippet as shipped, read back from the Application; no operator runs."""
    custom = client.CustomObjectsApi(kube)
    namespace = f"argocd-health-{uuid.uuid4().hex[:6]}"
    names = sorted(n for n in HEALTH if status_fixture(n)["kind"] in NAMESPACED)
    for name in names:
        obj = status_fixture(name)
        repo.write(
            f"health/{name}.yaml",
            {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {"name": name}, "spec": obj["spec"]},
        )
    revision = repo.commit("a resource per status fixture")
    app = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Application",
        "metadata": {"name": "fibers-health", "namespace": argocd.NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo.url, "targetRevision": "main", "path": "health"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
            "syncPolicy": {"automated": {"prune": True}, "syncOptions": ["CreateNamespace=true"]},
        },
    }
    argo.apply(app)
    try:
        argo.wait_synced(revision, "fibers-health", timeout=60)
        for name in names:
            kind = status_fixture(name)["kind"]
            argo.wait_health("fibers-health", kind, name, "Progressing", "Waiting for the operator to report a status")
        for name in names:
            if status_fixture(name).get("status"):
                _write_status(custom, namespace, name, status_fixture(name))
        for name in names:
            health, fragment = HEALTH[name]
            argo.wait_health("fibers-health", status_fixture(name)["kind"], name, health, fragment, timeout=15)
        for name, after in SAME_HEALTH_NEXT.items():
            _write_status(custom, namespace, name, status_fixture(after))
            health, fragment = HEALTH[after]
            assert HEALTH[name][0] == health
            argo.wait_health("fibers-health", status_fixture(name)["kind"], name, health, fragment, timeout=10)

        # Being deleted (a finalizer holds it): Argo CD says so itself, whatever the health check.
        hold = {"metadata": {"finalizers": ["fibers.dev/test-hold"]}}
        custom.patch_namespaced_custom_object(*FIBERS, namespace, "connects", "connect-running", hold)
        custom.delete_namespaced_custom_object(*FIBERS, namespace, "connects", "connect-running")
        argo.wait_health("fibers-health", "Connect", "connect-running", "Progressing", "Pending deletion", timeout=15)
        custom.patch_namespaced_custom_object(
            *FIBERS, namespace, "connects", "connect-running", {"metadata": {"finalizers": None}}
        )
    finally:
        argo.delete("fibers-health")
        with contextlib.suppress(ApiException):  # not there when the sync failed
            client.CoreV1Api(kube).delete_namespace(namespace)


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def _healthy_and_synced(argo: Argo, name: str) -> bool:
    status = argo.get(name).get("status") or {}
    return (status.get("health") or {}).get("status") == "Healthy" and (status.get("sync") or {}).get(
        "status"
    ) == "Synced"


def _wait_healthy_and_synced(argo: Argo, name: str, timeout: float) -> None:
    """Wait; on a timeout, say what Argo CD says of the Application and of each resource not Healthy/Synced."""
    try:
        wait_for(
            lambda: _healthy_and_synced(argo, name), timeout=timeout, interval=2, what=f"{name} Healthy and Synced"
        )
    except AssertionError as exc:
        status = argo.get(name).get("status") or {}
        lagging = [
            {k: r.get(k) for k in ("kind", "namespace", "name", "status", "health")}
            for r in status.get("resources") or []
            if r.get("status") != "Synced" or (r.get("health") or {}).get("status") not in (None, "Healthy")
        ]
        said = {k: status.get(k) for k in ("health", "sync", "conditions", "operationState")}
        raise AssertionError(f"{exc}; the Application: {said}; resources lagging: {lagging}") from None


def test_app_of_apps_installs_the_operator_then_the_pipeline_in_waves(gitops: GitOps, stack_info: StackInfo) -> None:
    argo = gitops.argo  # Healthy and Synced (the fixture waited)
    # Every resource Healthy, with the message the chart's health check gives.
    for kind, name, fragment in (
        ("Connect", "orders-cdc", "connector is RUNNING"),
        ("Transform", "orders-by-item", "streaming run"),
        ("DatabusConsumer", "orders-view", "consuming online"),
    ):
        # Waited for: a test before this one may have just restarted the operator or the streaming run.
        argo.wait_health("orders-pipeline", kind, name, "Healthy", fragment, timeout=300)
    assert argo.health("fibers-operator", "Deployment", "fibers-operator")[0] == "Healthy"

    # Real pods: the operator from the stack's image, Spark's driver and executor, the consumer.
    operator_pods = gitops.core.list_namespaced_pod(gitops.system).items
    running = [p for p in operator_pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    assert [p.spec.containers[0].image for p in running] == [stack_info.images["operator"]]

    def running_roles() -> set[str] | None:
        pods = [p for p in gitops.core.list_namespaced_pod(gitops.namespace).items if p.status.phase == "Running"]
        labels = [p.metadata.labels or {} for p in pods]
        roles = {lbl.get("spark-role", "") for lbl in labels} | {
            "consumer" for lbl in labels if lbl.get("fibers.dev/databusconsumer") == "orders-view"
        }
        return roles if {"driver", "executor", "consumer"} <= roles else None

    wait_for(running_roles, timeout=180, what="Spark's driver and executor and the consumer running")

    # The waves held: the pipeline's Application only once the operator was Available; the Connect's
    # readers only once the Connect was Ready (as read when all was first synced).
    waves = gitops.waves
    assert waves["pipeline created"] >= waves["operator available"], waves
    assert waves["Transform created"] >= waves["connect ready"], waves
    assert waves["DatabusConsumer created"] >= waves["connect ready"], waves


CONNECT = "examples/argocd/pipeline/1-connect.yaml"


def test_pause_a_broken_config_and_its_revert_through_git(gitops: GitOps) -> None:
    looks = gitops.witness.looks
    argo, repo = gitops.argo, gitops.repo
    connector = gitops.table
    good = repo.read(CONNECT)

    paused = copy.deepcopy(good)
    paused["spec"]["state"] = "paused"
    repo.write(CONNECT, paused)
    gitops.commit("pause the CDC")
    argo.wait_health("orders-pipeline", "Connect", "orders-cdc", "Suspended", "PAUSED", timeout=60)
    assert gitops.connect.get(f"/connectors/{connector}/status").json()["connector"]["state"] == "PAUSED"

    # A config Kafka Connect refuses, and a new reader in the next wave in the same commit.
    broken = copy.deepcopy(good)
    broken["spec"]["config"]["snapshot.mode"] = "bogus"
    repo.write(CONNECT, broken)
    audit = repo.read("examples/argocd/pipeline/2-databusconsumer.yaml")
    audit["metadata"]["name"] = "orders-audit"
    audit["spec"]["sink"]["collection"] = "orders_audit"
    repo.write("examples/argocd/pipeline/2-databusconsumer-audit.yaml", audit)
    with gitops.witness.change():
        revision = repo.commit("a broken snapshot mode, and an audit consumer")
        argo.refresh("orders-pipeline")
        message = argo.wait_health("orders-pipeline", "Connect", "orders-cdc", "Degraded", "snapshot.mode", timeout=90)
        assert "Value must be one of" in message  # Kafka Connect's own words
        wait_for(
            lambda: (
                (argo.get("orders-pipeline").get("status", {}).get("operationState") or {}).get("phase") == "Failed"
            ),
            timeout=60,
            what="the sync of the broken revision to stop at wave 1",
        )
        time.sleep(15)  # Argo CD's first retry would come after 10 s
        assert not gitops.resource("DatabusConsumer", "orders-audit"), "wave 2 ran past a Degraded wave 1"
        app = argo.get("orders-pipeline")
        assert app["status"]["health"]["status"] == "Degraded"
        assert app["status"]["operationState"]["syncResult"]["revision"] == revision

        repo.write(CONNECT, good)
        revision = repo.commit("revert the snapshot mode")
        argo.wait_synced(revision, "orders-pipeline", timeout=180)
    argo.wait_health("orders-pipeline", "Connect", "orders-cdc", "Healthy", "RUNNING", timeout=60)
    argo.wait_health("orders-pipeline", "DatabusConsumer", "orders-audit", "Healthy", timeout=180)
    assert gitops.connect.get(f"/connectors/{connector}/status").json()["connector"]["state"] == "RUNNING"
    gitops.witness.wait_looked(looks)  # it watched during this test, after its last change too
    assert gitops.witness.findings == []


def test_self_heal_and_what_the_operator_does_keep_the_application_synced(gitops: GitOps) -> None:
    looks = gitops.witness.looks
    argo = gitops.argo
    # By hand, behind git's back: self-heal puts it back.
    with gitops.witness.change():
        gitops.custom.patch_namespaced_custom_object(
            *FIBERS, gitops.namespace, "connects", "orders-cdc", {"spec": {"tasksMax": 3}}
        )
        wait_for(
            lambda: gitops.resource("Connect", "orders-cdc")["spec"]["tasksMax"] == 1,
            timeout=60,
            what="self-heal to put tasksMax back",
        )
        wait_for(lambda: _healthy_and_synced(argo, "orders-pipeline"), timeout=60, what="orders-pipeline back in sync")

    # The operator restarted (a new pod), offsets reset on request, a Transform rerun from git.
    for pod in gitops.core.list_namespaced_pod(gitops.system).items:
        gitops.core.delete_namespaced_pod(pod.metadata.name, gitops.system)
    wait_for(lambda: _healthy_and_synced(argo, "fibers-operator"), timeout=120, what="the operator back")
    gitops.custom.patch_namespaced_custom_object(
        *FIBERS,
        gitops.namespace,
        "connects",
        "orders-cdc",
        {"metadata": {"annotations": {"fibers.dev/offsets": "reset"}}},
    )
    wait_for(
        lambda: (
            "fibers.dev/offsets" not in (gitops.resource("Connect", "orders-cdc")["metadata"].get("annotations") or {})
        ),
        timeout=120,
        what="the offsets reset done",
    )
    argo.wait_health("orders-pipeline", "Connect", "orders-cdc", "Healthy", "RUNNING", timeout=60)
    before = gitops.resource("Transform", "orders-by-item")["status"]["currentRun"]["name"]
    transform = gitops.repo.read("examples/argocd/pipeline/2-transform.yaml")
    transform["spec"]["rerunNonce"] = "again"
    gitops.repo.write("examples/argocd/pipeline/2-transform.yaml", transform)
    gitops.commit("rerun the aggregation")
    wait_for(
        lambda: gitops.resource("Transform", "orders-by-item")["status"]["currentRun"]["name"] != before,
        timeout=120,
        what="a new run",
    )
    argo.wait_health("orders-pipeline", "Transform", "orders-by-item", "Healthy", "streaming run", timeout=300)
    time.sleep(10)  # what the operator writes after the run settles is watched too
    gitops.witness.wait_looked(looks)  # it watched during this test, after its last change too
    assert gitops.witness.findings == []


def test_a_connect_removed_from_git_is_pruned_with_its_connector_never_one_it_did_not_create(
    gitops: GitOps, tmp_path: Path
) -> None:
    looks = gitops.witness.looks
    argo, repo, connect = gitops.argo, gitops.repo, gitops.connect
    lines = tmp_path / "lines.txt"
    lines.write_text("one\ntwo\n")
    foreign = f"{gitops.table}-foreign"
    config = {"connector.class": "FileStreamSource", "file": str(lines), "topic": foreign}
    assert connect.put(f"/connectors/{foreign}/config", json=config).status_code == 201
    base = {"apiVersion": "fibers.dev/v1beta1", "kind": "Connect"}
    owned = {
        **base,
        "metadata": {"name": "lines", "annotations": {"argocd.argoproj.io/sync-wave": "1"}},
        "spec": {
            "class": "FileStreamSource",
            "connectorName": f"{gitops.table}-lines",
            "config": {"file": str(lines), "topic": f"{gitops.table}-lines"},
        },
    }
    claim = {
        **base,
        "metadata": {"name": "claim", "annotations": {"argocd.argoproj.io/sync-wave": "1"}},
        "spec": {
            "class": "FileStreamSource",
            "connectorName": foreign,
            "config": {"file": str(lines), "topic": foreign},
        },
    }
    repo.write("examples/argocd/pipeline/1-connect-lines.yaml", owned)
    repo.write("examples/argocd/pipeline/1-connect-claim.yaml", claim)
    gitops.commit("two more Connects")
    argo.wait_health("orders-pipeline", "Connect", "lines", "Healthy", timeout=60)
    argo.wait_health("orders-pipeline", "Connect", "claim", "Degraded", "a connector Fibers did not create", timeout=60)

    repo.remove("examples/argocd/pipeline/1-connect-lines.yaml")
    repo.remove("examples/argocd/pipeline/1-connect-claim.yaml")
    gitops.commit("remove them")
    for name in ("lines", "claim"):
        wait_for(lambda n=name: not gitops.resource("Connect", n), timeout=60, what=f"Connect {name} pruned")  # type: ignore[misc]
    assert connect.get(f"/connectors/{gitops.table}-lines").status_code == 404  # it created this one
    assert connect.get(f"/connectors/{foreign}/status").json()["connector"]["state"] == "RUNNING"  # not this one
    connect.delete(f"/connectors/{foreign}")
    gitops.witness.wait_looked(looks)  # it watched during this test, after its last change too
    assert gitops.witness.findings == []
