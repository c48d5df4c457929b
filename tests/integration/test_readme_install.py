"""The README's "Install on your cluster" blocks, run as a platform team pastes them.

Each shell block of that section runs in bash from the repository's root, in order, against the local
stack: the images and the chart go to the stack's OCI registry under a path of this test's own, the release
is installed from there, upgraded and uninstalled. Only what a reader chooses is replaced — the registry,
the release's name, its namespace, the watched namespaces and where the images' values are written (a file
of the test's own, never the repository's) — and the registry's private CA is trusted
the way Go programs (buildah, helm) read one: SSL_CERT_FILE.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from fibers_stack import StackInfo, fetch, images
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Install on your cluster"
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")


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


@pytest.fixture
def team_namespaces(kube: ApiClient) -> Iterator[list[str]]:
    core = client.CoreV1Api(kube)
    names = [f"readme-team-{uuid.uuid4().hex[:5]}" for _ in range(2)]
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield names
    for name in names:
        core.delete_namespace(name)


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
    try:
        for index, block in enumerate(install_blocks()):
            script = block
            for old, new in replacements.items():
                script = script.replace(old, new)
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
    finally:
        subprocess.run([str(fetch.helm()), "uninstall", release, "-n", namespace], env=env, capture_output=True)
        subprocess.run(["kubectl", "delete", "namespace", namespace, "--wait=false"], env=env, capture_output=True)
