"""An earlier version of Fibers on the stack: its images and chart, built from a pinned commit of this repository.

The upgrade test installs what a platform team ran before (the chart and images of that commit, from the
stack's registry), upgrades to the working tree and rolls back. The commit's files come out of git
(`git archive`) into the cache, once per commit; its images are built from its own Dockerfile under names
of their own (`fibers-<commit>`, `fibers-job-<commit>`) and pushed beside the current ones; its chart is
pushed under `<registry>/<commit>/charts`.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fibers_stack import StackInfo, images, registry
from fibers_stack.layout import REPO_ROOT, cache_dir

log = logging.getLogger("fibers_stack.previous")


@dataclass(frozen=True)
class Version:
    """An earlier version, published on the stack's registry."""

    commit: str
    operator: str  # <registry>/fibers-<commit>:<tag>@<digest>
    job: str
    chart: str  # oci://<registry>/<commit>/charts/fibers
    chart_version: str

    def chart_source(self, info: StackInfo) -> list[str]:
        """The chart argument of `helm install`/`upgrade`, as StackInfo.chart_source gives the current one."""
        return registry.chart_source(self.chart, self.chart_version, info.oci_registry().ca)


def source_tree(commit: str) -> Path:
    """The repository's files at `commit`, unpacked into the cache once (from git; fetched if a shallow clone
    lacks the commit)."""
    tree = cache_dir() / "trees" / commit
    if tree.exists():
        return tree
    git = ["git", "-C", str(REPO_ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True).returncode != 0:
        fetch = [*git, "fetch", "--quiet", "--depth", "1", "origin", commit]
        fetched = subprocess.run(fetch, capture_output=True, text=True)
        if fetched.returncode != 0:
            raise RuntimeError(f"commit {commit} is not in this clone and could not be fetched: {fetched.stderr}")
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent) as scratch:
        archive = Path(scratch) / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run([*git, "archive", "--format=tar", commit], stdout=out, check=True)
        unpacked = Path(scratch) / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        shutil.move(str(unpacked), tree)
    log.info("unpacked an earlier version", extra={"commit": commit, "tree": str(tree)})
    return tree


def publish(info: StackInfo, commit: str) -> Version:
    """Build the commit's two images and push them and its chart to the stack's registry."""
    tree = source_tree(commit)
    operator, job = images.build_fibers(root=tree, suffix=f"-{commit[:12]}")
    reg = info.oci_registry()
    chart, version = registry.push_chart(f"{reg.host}/{commit[:12]}", reg.ca, chart=tree / "charts" / "fibers")
    return Version(
        commit=commit,
        operator=images.push(reg, operator),
        job=images.push(reg, job),
        chart=chart,
        chart_version=version,
    )
