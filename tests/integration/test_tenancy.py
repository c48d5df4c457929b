"""Tenants kept apart, with real RBAC: a team that can edit Fibers resources in its own namespace (the
`edit` ClusterRole, which the chart's aggregated roles extend, bound in that namespace only; a token of
its own ServiceAccount, not the admin kubeconfig) reaches nothing of another team's through the operator.

One operator watches both namespaces, with the chart's pod policy. Team A runs a connector; team B
tries, as itself, every way the operator could be turned on A: A's connector by name and with a forged
claim, ConfigMaps it did not create, A's Secret through a reference, images, ServiceAccounts, hostPath
and Spark settings the platform did not allow, and a ConnectCluster of its own. After each, A's
connector is unchanged, and B's resource says which field was refused. Then the pods' side: what B's
people and pods may do in A (nothing of Leases, checkpoints, Secrets), a Lease B planted under its own
consumer's name, and figures B writes for the operator to read, malformed and oversized.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, utils
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from fibers.api import ANNOTATION_CONNECT_CLUSTER, ANNOTATION_OWNED_CONNECTOR
from fibers.consumer.ownership import lease_name
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.stats import STATS_MAX_CHARS
from fibers.databus.timelines import STATS_ANNOTATION
from fibers_stack import StackInfo, fetch, images, namespaces
from fibers_stack.namespaces import CONSUMER_SERVICE_ACCOUNT, JOBS_SERVICE_ACCOUNT
from tests.helpers import Resources, render_chart, token_kubeconfig, wait_for
from tests.integration.conftest import OperatorProcess
from tests.integration.test_connect import live_config, live_state

pytestmark = pytest.mark.connect


@pytest.fixture(scope="module")
def team_b(kube: ApiClient, crds: None) -> Iterator[str]:
    name = f"team-b-{uuid.uuid4().hex[:6]}"
    namespaces.create(kube, name)
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


@pytest.fixture(scope="module")
def aggregated_roles(kube: ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The chart's fibers-view and fibers-edit ClusterRoles, which Kubernetes folds into view/edit/admin."""
    docs = render_chart(fetch.helm(), "default", {}, tmp_path_factory.mktemp("roles"))
    roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(("-view", "-edit"))]
    for role in roles:
        role["metadata"]["name"] = f"tenancy-{uuid.uuid4().hex[:6]}-{role['metadata']['name']}"
    utils.create_from_yaml(kube, yaml_objects=roles)
    yield
    rbac = client.RbacAuthorizationV1Api(kube)
    for role in roles:
        rbac.delete_cluster_role(role["metadata"]["name"])


@pytest.fixture(scope="module")
def as_b(
    kube: ApiClient,
    stack_info: StackInfo,
    team_b: str,
    aggregated_roles: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> ApiClient:
    """An API client with team B's own credentials: a ServiceAccount bound to `edit` in B only."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(team_b, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="dev")))
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="dev-edit"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="dev", namespace=team_b)],
    )
    rbac.create_namespaced_role_binding(team_b, binding)
    path = token_kubeconfig(kube, stack_info, team_b, "dev", tmp_path_factory.mktemp("b") / "kubeconfig")
    api = config.new_client_from_config(config_file=str(path))
    # The aggregation controller folds the chart's roles into `edit` within moments: until then B may not.
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                group="fibers.dev", resource="connects", verb="create", namespace=team_b
            )
        )
    )
    wait_for(
        lambda: client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed,
        timeout=60,
        what="edit to include Fibers' resources",
    )
    return api


@pytest.fixture(scope="module")
def operator(
    stack_info: StackInfo, namespace: str, team_b: str, connect_cluster: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator for both teams, with the chart's policy (its defaults: the job image, its ServiceAccount)."""
    host, name, _, _ = images.parse(stack_info.images["job"])
    repository = f"{host}/{name}"
    env = {
        "FIBERS_CONNECT_DEFAULT_CLUSTER": connect_cluster,
        "FIBERS_CONNECT_SYNC_INTERVAL": "2",
        "FIBERS_JOB_SERVICE_ACCOUNT": JOBS_SERVICE_ACCOUNT,
        "FIBERS_ALLOWED_IMAGES": f"{repository}:",
        "FIBERS_CONSUMER_SERVICE_ACCOUNT": CONSUMER_SERVICE_ACCOUNT,
        "FIBERS_ALLOWED_SERVICE_ACCOUNTS": f"{JOBS_SERVICE_ACCOUNT},{CONSUMER_SERVICE_ACCOUNT}",
        "FIBERS_ALLOW_HOST_PATH": "false",
    }
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(stack_info, namespace, log, env, ("-n", team_b))
    op.start()
    yield op
    op.stop()


@pytest.fixture
def source_file(tmp_path: Path) -> Path:
    path = tmp_path / "source.txt"
    path.write_text("record\n")
    os.chmod(tmp_path, 0o755)
    return path


def _source(path: Path, topic: str, **extra: Any) -> dict[str, Any]:
    return {"class": "FileStreamSource", "config": {"file": str(path), "topic": topic}, **extra}


def test_team_b_reaches_nothing_of_team_a_through_the_operator(
    kube: ApiClient,
    as_b: ApiClient,
    operator: OperatorProcess,
    namespace: str,
    team_b: str,
    connect_http: Any,
    source_file: Path,
    unique: str,
) -> None:
    team_a = namespace
    a_connects = Resources(kube, "connects", team_a)
    a_connects.create(unique, _source(source_file, unique))
    a_connects.wait_condition(unique, "True", "Running")
    a_config = live_config(connect_http, unique)
    client.CoreV1Api(kube).create_namespaced_secret(
        team_a, client.V1Secret(metadata=client.V1ObjectMeta(name=f"{unique}-db"), string_data={"password": "a-only"})
    )

    b_connects = Resources(as_b, "connects", team_b)
    b_consumers, b_transforms = Resources(as_b, "databusconsumers", team_b), Resources(as_b, "transforms", team_b)
    b_core = client.CoreV1Api(as_b)
    forged = {ANNOTATION_OWNED_CONNECTOR: unique, ANNOTATION_CONNECT_CLUSTER: a_connects.status(unique)["cluster"]}

    # The positive control: B's own connector runs, so what is refused below is refused for a reason.
    own = f"{unique}-own"  # connector names are the Kafka Connect cluster's, shared by every test
    b_connects.create(own, _source(source_file, f"{team_b}-own"))
    b_connects.wait_condition(own, "True", "Running")

    # A's connector, by a Connect of the same name with a forged claim, and by connectorName.
    b_connects.create(unique, _source(source_file, f"{team_b}-x"), annotations=forged)
    b_connects.create("named", {**_source(source_file, f"{team_b}-y"), "connectorName": unique})
    for name in (unique, "named"):
        cond = b_connects.wait_condition(name, "False", "ConnectorNotOwned")
        assert f"namespace {team_a}" in cond["message"]
    # A's Secret, through a reference: looked for in B only.
    b_connects.create(
        "secret",
        {
            **_source(source_file, f"{team_b}-z"),
            "secretConfig": {"password": {"secretKeyRef": {"name": f"{unique}-db", "key": "password"}}},
        },
    )
    cond = b_connects.wait_condition("secret", "False", "SecretNotFound")
    assert f"Secret {team_b}/{unique}-db not found" in cond["message"]

    # ConfigMaps the operator did not create: B's own, named as a checkpoint with a seek and retention Delete.
    b_core.create_namespaced_config_map(
        team_b, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"k": "v"})
    )
    checkpoint = {"configMapName": "settings", "retention": "Delete"}
    consumer = {"sources": ["t"], "sink": {"type": "log"}}
    b_consumers.create("cm", {**consumer, "checkpoint": checkpoint, "seek": {"to": "earliest", "nonce": "1"}})
    assert f"no label {LABEL_CONSUMER}" in b_consumers.wait_condition("cm", "False", "Conflict", timeout=30)["message"]

    # Pods beyond what the platform allowed: an image, a ServiceAccount, hostPath, Spark settings.
    b_consumers.create("image", {**consumer, "image": "registry.evil.example/miner:1"})
    b_consumers.create("account", {**consumer, "serviceAccount": "default"})
    job = {
        "inputs": [{"name": "t", "kafka": {"topics": ["t"], "schema": "id INT"}}],
        "sql": "SELECT * FROM t",
        "output": {"kafka": {"topic": f"{team_b}-out"}},
    }
    host = {
        "volumes": [{"name": "node", "hostPath": {"path": "/"}}],
        "volumeMounts": [{"name": "node", "mountPath": "/node"}],
    }
    b_transforms.create("host", {**job, "spark": host})
    b_transforms.create("conf", {**job, "spark": {"sparkConf": {"spark.kubernetes.namespace": team_a}}})
    # spark-submit, in the Spark Operator's pod, would copy its own token into a ConfigMap of B's namespace;
    # an NFS export reaches other teams' directories.
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    submitter = {
        "sparkConf": {"spark.kubernetes.kerberos.krb5.path": token},
        "volumes": [{"name": "shared", "nfs": {"server": "nfs.storage", "path": "/export"}}],
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
    }
    b_transforms.create("submitter", {**job, "spark": submitter})
    refused = {
        (b_consumers, "image"): "spec.image: image registry.evil.example/miner:1 is not allowed",
        (b_consumers, "account"): "spec.serviceAccount: ServiceAccount default is not allowed",
        (b_transforms, "host"): "spec.spark.volumes[0].hostPath: hostPath volumes are not allowed",
        (b_transforms, "conf"): "spec.spark.sparkConf.spark.kubernetes.namespace:",
        (b_transforms, "submitter"): "spec.spark.sparkConf.spark.kubernetes.kerberos.krb5.path:",
    }
    for (resources, name), message in refused.items():
        assert message in resources.wait_condition(name, "False", "InvalidSpec", timeout=30)["message"]
    assert "spec.spark.volumes[0].nfs: nfs volumes are not allowed" in b_transforms.condition("submitter")["message"]

    # Cluster-scoped: a ConnectCluster of B's own (a URL of its choosing, any namespace's Secret) is refused.
    cluster = {
        "apiVersion": "fibers.dev/v1beta1",
        "kind": "ConnectCluster",
        "metadata": {"name": f"b-{unique}"},
        "spec": {"url": "http://b.example:8083"},
    }
    with pytest.raises(ApiException) as refused_cluster:
        client.CustomObjectsApi(as_b).create_cluster_custom_object("fibers.dev", "v1beta1", "connectclusters", cluster)
    assert refused_cluster.value.status == 403
    registry = {**cluster, "kind": "SchemaRegistry", "spec": {"url": "http://b.example:8080/apis/ccompat/v7"}}
    b_custom = client.CustomObjectsApi(as_b)
    with pytest.raises(ApiException) as refused_registry:  # nor a registry (its auth Secrets, adopt consent)
        b_custom.create_cluster_custom_object("fibers.dev", "v1beta1", "schemaregistries", registry)
    assert refused_registry.value.status == 403

    # B deletes everything it made; A's connector is untouched throughout, its ConfigMap too.
    for resources, names in (
        (b_connects, (own, unique, "named", "secret")),
        (b_consumers, ("cm", "image", "account")),
        (b_transforms, ("host", "conf", "submitter")),
    ):
        for name in names:
            resources.delete(name)
        for name in names:
            wait_for(lambda r=resources, n=name: not r.exists(n), timeout=60, what=f"{name} deleted by B")
    assert b_core.read_namespaced_config_map("settings", team_b).data == {"k": "v"}
    assert live_config(connect_http, unique) == a_config
    assert live_state(connect_http, unique) == "RUNNING"
    assert a_connects.condition(unique)["status"] == "True"
    a_connects.delete(unique)
    wait_for(lambda: not a_connects.exists(unique), timeout=60, what="A's Connect deleted")


def _may(kube: ApiClient, namespace: str, account: str, verb: str, resource: str, where: str, group: str = "") -> bool:
    """Whether the ServiceAccount `namespace`/`account` may `verb` `resource` in `where`, as the API server decides."""
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{namespace}:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(group=group, resource=resource, verb=verb, namespace=where),
        )
    )
    return bool(client.AuthorizationV1Api(kube).create_subject_access_review(review).status.allowed)


def test_team_b_reaches_no_lease_secret_or_memory_of_the_operator_through_its_pods_or_writes(
    kube: ApiClient, as_b: ApiClient, operator: OperatorProcess, namespace: str, team_b: str, unique: str
) -> None:
    team_a = namespace
    coordination = client.CoordinationV1Api(kube)
    # A consumer of A's holds a Lease; B names a consumer of its own the same.
    a_lease = lease_name("orders", "t", 0)
    coordination.create_namespaced_lease(
        team_a,
        client.V1Lease(
            metadata=client.V1ObjectMeta(name=a_lease, labels={LABEL_CONSUMER: "orders"}),
            spec=client.V1LeaseSpec(holder_identity="orders-0_a", lease_duration_seconds=15),
        ),
    )
    before = coordination.read_namespaced_lease(a_lease, team_a).metadata.resource_version

    # What B's people and B's pods (consumers, Spark drivers) may do in A, as the API server decides: nothing
    # of Leases, checkpoints or Secrets. The positive control: the consumer pods' own Leases in B.
    assert _may(kube, team_b, CONSUMER_SERVICE_ACCOUNT, "update", "leases", team_b, "coordination.k8s.io")
    for account in ("dev", CONSUMER_SERVICE_ACCOUNT, JOBS_SERVICE_ACCOUNT):
        for verb, resource, group in (
            ("update", "leases", "coordination.k8s.io"),
            ("update", "configmaps", ""),
            ("get", "secrets", ""),
        ):
            assert not _may(kube, team_b, account, verb, resource, team_a, group), (account, verb, resource)

    b_consumers, b_core = Resources(as_b, "databusconsumers", team_b), client.CoreV1Api(as_b)
    consumer = {"sources": ["t"], "sink": {"type": "log"}}
    # A Lease B made under the name of one of its consumer's partitions: never taken over, a Conflict.
    planted = lease_name("leased", "t", 0)
    client.CoordinationV1Api(as_b).create_namespaced_lease(
        team_b, client.V1Lease(metadata=client.V1ObjectMeta(name=planted), spec=client.V1LeaseSpec(holder_identity="b"))
    )
    b_consumers.create("leased", consumer)
    assert f"Lease {planted}" in b_consumers.wait_condition("leased", "False", "Conflict", timeout=30)["message"]
    b_consumers.create("orders", {**consumer, "serviceAccount": "default"})  # A's consumer's name, refused pods

    # A Secret of A's through the consumer's reference: the reference has no namespace (the API server drops
    # one), so its pods could only ever be given B's Secret of that name.
    sink = {"type": "mongodb", "database": "d", "collection": "c"}
    sink["uriSecretRef"] = {"name": f"{unique}-db", "key": "uri", "namespace": team_a}
    b_consumers.create("secretref", {"sources": ["t"], "sink": sink, "serviceAccount": "default"})
    assert b_consumers.get("secretref")["spec"]["sink"]["uriSecretRef"] == {"name": f"{unique}-db", "key": "uri"}

    # Figures B's pods (or B) write on the checkpoint ConfigMap: malformed, then oversized. The consumer runs
    # no pod (its ServiceAccount is refused), so what the operator reads is B's writing alone.
    b_core.create_namespaced_config_map(
        team_b,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="stats-checkpoint",
                labels={LABEL_CONSUMER: "stats"},
                annotations={f"{STATS_ANNOTATION}0": "{not json"},
            )
        ),
    )
    b_consumers.create("stats", {**consumer, "serviceAccount": "default"})
    said = "instance figures ignored: fibers.dev/stats-0"
    wait_for(lambda: f"{said}: not JSON" in operator.log(), timeout=30, what="malformed figures said")
    for filler in "xy":  # two changes, one message: said once, not at every reconcile
        patch = {"metadata": {"annotations": {f"{STATS_ANNOTATION}0": filler * (STATS_MAX_CHARS + 1)}}}
        b_core.patch_namespaced_config_map("stats-checkpoint", team_b, patch)
        wait_for(lambda: f"{said}: over" in operator.log(), timeout=30, what="oversized figures said")
    wait_for(lambda: b_consumers.status("stats").get("checkpointConfigMap"), timeout=30, what="status written")
    assert "sinks" not in b_consumers.status("stats") and operator.log().count(f"{said}: over") == 1

    for name in ("leased", "orders", "secretref", "stats"):
        b_consumers.delete(name)
    for name in ("leased", "orders", "secretref", "stats"):
        wait_for(lambda n=name: not b_consumers.exists(n), timeout=60, what=f"{name} deleted by B")
    assert coordination.read_namespaced_lease(a_lease, team_a).metadata.resource_version == before
    assert client.CoordinationV1Api(as_b).read_namespaced_lease(planted, team_b).spec.holder_identity == "b"
    coordination.delete_namespaced_lease(a_lease, team_a)
