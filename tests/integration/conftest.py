"""Fixtures for operator tests: CRDs installed, a namespace, and the operator as a real process.

Each test namespace is one a user would run pipelines in: the Spark Operator watches it (label), and
it has the chart's jobs ServiceAccount and RBAC, which Spark drivers and consumer pods run as.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client, config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from fibers_stack import StackInfo, namespaces, platform_resources, process
from fibers_stack.namespaces import CONSUMER_SERVICE_ACCOUNT, JOBS_SERVICE_ACCOUNT
from tests.helpers import Resources, wait_for

REPO = Path(__file__).resolve().parents[2]
WITHOUT_KUBERNETES = REPO / "tools" / "without-kubernetes"


STACK_CLUSTER = "stack"  # the ConnectCluster of the stack's Kafka Connect: the test operators' default


@pytest.fixture(scope="session")
def connect_cluster(kube: ApiClient, crds: None, stack_info: StackInfo) -> str:
    platform_resources.apply(kube, STACK_CLUSTER, stack_info.connect_url)
    return STACK_CLUSTER


STACK_REGISTRY = "stack"  # the SchemaRegistry of the stack's Apicurio: the test operators' default


@pytest.fixture(scope="session")
def schema_registry(kube: ApiClient, crds: None, stack_info: StackInfo) -> str:
    url = stack_info.registry_url + "/apis/ccompat/v7"
    platform_resources.apply(kube, STACK_REGISTRY, url, plural=platform_resources.SCHEMA_REGISTRIES)
    return STACK_REGISTRY


@pytest.fixture(scope="module")
def namespace(kube: ApiClient, crds: None) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:6]}"
    namespaces.create(kube, name)
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


@pytest.fixture(scope="module")
def mongo_secret(kube: ApiClient, namespace: str, stack_info: StackInfo) -> str:
    """A Secret `mongo` with the stack's MongoDB URI under `uri`, as pipelines reference it."""
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="mongo"), string_data={"uri": stack_info.mongodb_uri})
    client.CoreV1Api(kube).create_namespaced_secret(namespace, secret)
    return "mongo"


def free_port() -> int:
    """A loopback port nothing listens on now, outside the range outgoing connections take theirs from."""
    return process.free_port("127.0.0.1")


def scrape(port: int, series: str, /, **labels: str) -> list[float]:
    """The values of the samples `series` with these labels (among others) on a local process's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == series and labels.items() <= sample.labels.items()
    ]


class OperatorProcess:
    """`fibers run` as a subprocess watching one namespace, with its log kept in a file."""

    def __init__(
        self, stack: StackInfo, namespace: str, log_file: Path, env: dict[str, str], args: tuple[str, ...] = ()
    ) -> None:
        self.stack, self.namespace, self.log_file = stack, namespace, log_file
        self.metrics_port = free_port()  # its Prometheus metrics, at http://127.0.0.1:<port>/metrics
        self.args = ("--metrics-port", str(self.metrics_port), *args)
        # As in the operator image: no `kubernetes` package (see tools/without-kubernetes).
        python_path = os.pathsep.join(p for p in (str(WITHOUT_KUBERNETES), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, **stack.env(), "PYTHONPATH": python_path, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fibers", "run", "-n", self.namespace, *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def metric(self, series: str, /, **labels: str) -> list[float]:
        """The values of the samples `series` with these labels (among others) on its /metrics now."""
        return scrape(self.metrics_port, series, **labels)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@pytest.fixture(scope="module")
def lineage_topic(namespace: str) -> str:
    """The Kafka topic a module's operator sends its OpenLineage events to, when the module turns them on."""
    return f"lineage-{namespace}"


def lineage_env(topic: str) -> dict[str, str]:
    """The operator's environment for OpenLineage events on `topic` (a module's `operator_env`)."""
    return {"FIBERS_LINEAGE_TOPIC": topic, "FIBERS_LINEAGE_NAMESPACE": "fibers-test"}


@pytest.fixture(scope="module")
def operator_env() -> dict[str, str]:
    """More environment for this module's operator (a module overrides this fixture to turn features on)."""
    return {}


@pytest.fixture(scope="module")
def operator(
    stack_info: StackInfo,
    namespace: str,
    connect_cluster: str,
    schema_registry: str,
    operator_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log_file = tmp_path_factory.mktemp("operator") / "operator.log"
    env = {
        "FIBERS_CONNECT_DEFAULT_CLUSTER": connect_cluster,
        "FIBERS_SCHEMA_REGISTRY_DEFAULT": schema_registry,
        "FIBERS_SCHEMA_RESYNC": "3",
        "FIBERS_CONNECT_CLUSTER_REFRESH": "5",
        "FIBERS_CONNECT_SYNC_INTERVAL": "2",
        "FIBERS_CONNECT_FAST_INTERVAL": "0.5",
        "FIBERS_JOB_SERVICE_ACCOUNT": JOBS_SERVICE_ACCOUNT,
        "FIBERS_CONSUMER_SERVICE_ACCOUNT": CONSUMER_SERVICE_ACCOUNT,
        **operator_env,
    }
    op = OperatorProcess(stack_info, namespace, log_file, env)
    op.start()
    time.sleep(1)
    yield op
    try:
        _delete_all(op, stack_info, namespace)
    finally:
        op.stop()  # a failed clean-up must not leave this operator running into the next module


@pytest.fixture
def transforms(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    """This module's Transforms, with its operator running."""
    return Resources(kube, "transforms", namespace)


@pytest.fixture
def consumers(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    """This module's DatabusConsumers, with its operator running."""
    return Resources(kube, "databusconsumers", namespace)


def _delete_all(op: OperatorProcess, stack: StackInfo, namespace: str) -> None:
    """Delete this module's resources while the operator still runs, so finalizers complete."""
    if op.proc is None or op.proc.poll() is not None:
        op.start()
    custom = client.CustomObjectsApi(config.new_client_from_config(config_file=stack.kubeconfig))
    for plural in ("databusconsumers", "transforms", "connects", "schemas"):
        for item in custom.list_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural)["items"]:
            try:
                custom.delete_namespaced_custom_object(
                    "fibers.dev", "v1beta1", namespace, plural, item["metadata"]["name"]
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
        wait_for(
            lambda p=plural: not custom.list_namespaced_custom_object("fibers.dev", "v1beta1", namespace, p)["items"],
            timeout=60,
            what=f"{plural} in {namespace} deleted",
        )
