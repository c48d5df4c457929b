"""The README's "Install on your cluster" blocks, run as a platform team pastes them.

Each shell block of that section runs in bash from the repository's root, in order, against the local
stack: the images and the chart go to the stack's OCI registry under a path of this test's own, the release
is installed from there, upgraded and uninstalled — with a Connect, a Schema and a DatabusConsumer left in
place, which the uninstall must release (no finalizer left, what they made still running). Only what a
reader chooses is replaced — the registry, the release's name, its namespace, the watched namespaces, the
servers (the stack's, by their cluster names) and where the images' values are written (a file of the
test's own, never the repository's) — and the registry's private CA is trusted the way Go programs
(buildah, helm) read one: SSL_CERT_FILE.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from fibers.api import CONNECT_FINALIZER, FINALIZER
from fibers.conditions import is_true
from fibers_stack import StackInfo, fetch, images
from fibers_stack.apicurio import CCOMPAT
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Install on your cluster"
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")
KINDS = {"connects": "Connect", "schemas": "Schema", "databusconsumers": "DatabusConsumer"}
OURS = {FINALIZER, CONNECT_FINALIZER}


def owned_by_replica_set(pod: client.V1Pod) -> bool:
    """The operator's pod (its Deployment's), not the CRD hook Job's."""
    return any(o.kind == "ReplicaSet" for o in pod.metadata.owner_references or [])


def install_blocks() -> list[str]:
    """The ```bash blocks of the README's install section, in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


def test_the_install_section_has_the_four_blocks_a_platform_team_runs() -> None:
    blocks = install_blocks()
    assert [next(w for w in b.split() if w in ("make", "helm")) for b in blocks[1:]] == ["helm", "make", "helm"]
    assert "export REGISTRY=" in blocks[0] and "make images REGISTRY=$REGISTRY" in blocks[0]
    assert "helm install" in blocks[1] and "helm upgrade" in blocks[2] and "helm uninstall" in blocks[3]


def test_a_chosen_name_is_never_replaced_again() -> None:
    # The namespaces CI met: the first one's name holds the second placeholder.
    names = {"team-a": "readme-team-b94df", "team-b": "readme-team-1896a"}
    assert substitute("{team-a,team-b}", names) == "{readme-team-b94df,readme-team-1896a}"


@pytest.fixture
def team_namespaces(kube: ApiClient) -> Iterator[list[str]]:
    core = client.CoreV1Api(kube)
    names = [f"readme-team-{uuid.uuid4().hex[:5]}" for _ in range(2)]
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield names
    for name in names:
        core.delete_namespace(name)


def _leave_resources(kube: ApiClient, namespace: str, suffix: str) -> dict[str, str]:
    """One resource of each kind that holds a finalizer, taken over by the installed operator: the Connect's
    connector running, the Schema's subject registered. Returns the connector's and the subject's names."""
    custom = client.CustomObjectsApi(kube)
    specs = {
        "connects": {
            "class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
            "tasksMax": 1,
            "config": {"file": f"/tmp/readme-{suffix}.txt", "topic": f"readme-{suffix}"},
        },
        "schemas": {"subject": f"readme-{suffix}-value", "schema": '{"type": "string"}'},
        "databusconsumers": {"sources": [f"readme-{suffix}"], "sink": {"type": "log"}, "state": "stopped"},
    }
    for plural, spec in specs.items():
        body = {"apiVersion": "fibers.dev/v1beta1", "kind": KINDS[plural], "metadata": {"name": "left"}, "spec": spec}
        custom.create_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, body)

    def taken_over() -> bool:
        items = [custom.get_namespaced_custom_object("fibers.dev", "v1beta1", namespace, p, "left") for p in specs]
        return all(OURS & set(i["metadata"].get("finalizers") or []) for i in items) and all(
            is_true((i.get("status") or {}).get("conditions"), "Ready") for i in items[:2]
        )

    wait_for(taken_over, timeout=120, what="the operator to take over the Connect, Schema and DatabusConsumer")
    connect = custom.get_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "connects", "left")
    return {"connector": connect["status"]["connectorName"], "subject": specs["schemas"]["subject"]}


def _check_released(kube: ApiClient, stack_info: StackInfo, namespace: str, left: dict[str, str]) -> None:
    """After the uninstall: every resource is still there without Fibers' finalizers (the hook ran before
    `helm uninstall --wait` returned), deleting them waits for nothing, and what they made is left running."""
    custom = client.CustomObjectsApi(kube)
    for plural in KINDS:
        item = custom.get_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, "left")
        assert not OURS & set(item["metadata"].get("finalizers") or []), (plural, item["metadata"])
    connector = httpx.get(f"{stack_info.connect_url}/connectors/{left['connector']}/status", timeout=10)
    assert connector.status_code == 200 and connector.json()["connector"]["state"] == "RUNNING", connector.text
    for plural in KINDS:
        custom.delete_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, "left")

    def gone() -> bool:
        return not any(
            custom.list_namespaced_custom_object("fibers.dev", "v1beta1", namespace, p)["items"] for p in KINDS
        )

    wait_for(gone, timeout=15, what="the released resources to go at once")
    # Released, not deleted: the connector and the subject outlive their resources.
    assert httpx.get(f"{stack_info.connect_url}/connectors/{left['connector']}", timeout=10).status_code == 200
    subjects = httpx.get(f"{stack_info.registry_url}{CCOMPAT}/subjects", timeout=10).json()
    assert left["subject"] in subjects


def _remove_released(stack_info: StackInfo, left: dict[str, str]) -> None:
    httpx.delete(f"{stack_info.connect_url}/connectors/{left['connector']}", timeout=30)
    registry = f"{stack_info.registry_url}{CCOMPAT}/subjects/{left['subject']}"
    httpx.delete(registry, timeout=30)
    httpx.delete(registry, params={"permanent": "true"}, timeout=30)


def substitute(text: str, replacements: dict[str, str]) -> str:
    """Each reader's choice replaced in one pass, so a value is never itself replaced again: one after another,
    `team-a` -> `readme-team-b94df` then `team-b` -> ... rewrote the first namespace's name (a red CI)."""
    pattern = re.compile("|".join(re.escape(old) for old in sorted(replacements, key=len, reverse=True)))
    return pattern.sub(lambda match: replacements[match.group(0)], text)


def test_the_readme_installs_upgrades_and_uninstalls_from_an_oci_registry(
    stack_info: StackInfo, kube: ApiClient, team_namespaces: list[str], tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:5]
    release, namespace = f"readme-{suffix}", f"readme-system-{suffix}"
    registry = f"{stack_info.image_registry}/readme-{suffix}"
    replacements = {
        "registry.example.com/platform": registry,
        "fibers-system": namespace,
        "install fibers ": f"install {release} ",
        "upgrade fibers ": f"upgrade {release} ",
        "uninstall fibers ": f"uninstall {release} ",
        "team-a": team_namespaces[0],
        "team-b": team_namespaces[1],
        # The stack's servers, by the cluster names pods use (fibers_stack.services).
        "http://connect.kafka:8083": f"http://{stack_info.cluster_addresses['kafka-connect']}",
        "http://apicurio.registry:8080": f"http://{stack_info.cluster_addresses['schema-registry']}",
        "kafka.kafka:9092": stack_info.kafka_bootstrap,
    }
    # `make images` writes the images' values to VALUES (default fibers-images.yaml in the repository): here a
    # file of the test's own, so that a developer's is never touched.
    values_file = tmp_path / "fibers-images.yaml"
    replacements["-f fibers-images.yaml"] = f"-f {values_file}"
    # The stack's registry is signed by its own CA: trusted beside the system's, as a platform team's would be.
    bundle = tmp_path / "ca-bundle.crt"
    bundle.write_text(
        (SYSTEM_CAS.read_text() if SYSTEM_CAS.is_file() else "") + Path(stack_info.image_registry_ca).read_text()
    )
    tools = f"{fetch.helm().parent}:{fetch.kubernetes()}"
    env = {**os.environ, **stack_info.env(), "SSL_CERT_FILE": str(bundle), "PATH": f"{tools}:{os.environ['PATH']}"}
    env["REGISTRY"] = registry  # the first block's export, as the reader's shell keeps it for the next ones
    env["VALUES"] = str(values_file)
    core = client.CoreV1Api(kube)
    left: dict[str, str] = {}
    try:
        for index, block in enumerate(install_blocks()):
            if "helm uninstall" in block:  # uninstalled with resources present
                left = _leave_resources(kube, team_namespaces[0], suffix)
            script = substitute(block, replacements)
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"block {index + 1}:\n{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            if "helm install" in block or "helm upgrade" in block:
                [pod] = [
                    p
                    for p in core.list_namespaced_pod(namespace).items
                    if p.metadata.deletion_timestamp is None and owned_by_replica_set(p)
                ]
                image = pod.spec.containers[0].image
                host, name, _, digest = images.parse(image)
                # From the registry the block pushed to, pinned by the digest `make images` wrote.
                assert (host, name) == (registry, "fibers") and digest in values_file.read_text()
                ready = {c.type: c.status for c in pod.status.conditions}
                assert ready["Ready"] == "True", pod.status
        # Uninstalled: no release, no operator pod; the namespace is the reader's to remove.
        releases = subprocess.run(
            [str(fetch.helm()), "list", "-n", namespace, "-q"], env=env, capture_output=True, text=True, check=True
        )
        assert release not in releases.stdout.split()
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, timeout=60, what="the operator pod gone")
        _check_released(kube, stack_info, team_namespaces[0], left)
    finally:
        if left:
            _remove_released(stack_info, left)
        subprocess.run([str(fetch.helm()), "uninstall", release, "-n", namespace], env=env, capture_output=True)
        subprocess.run(["kubectl", "delete", "namespace", namespace, "--wait=false"], env=env, capture_output=True)
