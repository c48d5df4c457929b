"""Image tags are hashes of what a build reads; the job image's entry point dispatches Spark's container roles."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fibers_stack import build_inputs, images
from fibers_stack.layout import REPO_ROOT

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE} AS build
# a comment with COPY not-a-source /x
COPY pyproject.toml README.md ./
COPY --chmod=0755 app \\
     /src/app
FROM build AS final
COPY --from=build /src /src
ADD ["data/seed.json", "/seed.json"]
RUN echo done
"""


@pytest.fixture
def context(tmp_path: Path) -> Path:
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "README.md").write_text("readme\n")
    (tmp_path / "app" / "pkg").mkdir(parents=True)
    (tmp_path / "app" / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "seed.json").write_text("{}\n")
    (tmp_path / "unrelated.txt").write_text("not copied\n")
    return tmp_path


def tag(context: Path, **extra: str) -> str:
    return build_inputs.dockerfile_tag(context / "Dockerfile", context, {"target": "final", **extra})


def test_copied_sources_are_every_context_path_of_copy_and_add(context: Path) -> None:
    assert build_inputs.copied_sources(DOCKERFILE) == ["pyproject.toml", "README.md", "app", "data/seed.json"]


def test_the_repository_dockerfile_reads_what_the_images_need() -> None:
    sources = build_inputs.copied_sources((REPO_ROOT / "Dockerfile").read_text())
    for path in ("pyproject.toml", "README.md", "operator", "tools/spark-kafka/pom.xml", "docker/job-entrypoint.sh"):
        assert path in sources


def test_the_tag_is_stable_for_the_same_inputs(context: Path) -> None:
    assert tag(context) == tag(context)
    assert len(tag(context)) == build_inputs.TAG_LENGTH


@pytest.mark.parametrize(
    "change",
    [
        lambda c: (c / "Dockerfile").write_text(DOCKERFILE + "USER 10001\n"),
        lambda c: (c / "app" / "pkg" / "mod.py").write_text("X = 2\n"),
        lambda c: (c / "app" / "pkg" / "new.py").write_text(""),
        lambda c: (c / "data" / "seed.json").write_text("[]\n"),
        lambda c: (c / ".dockerignore").write_text("*.md\n"),
    ],
    ids=["dockerfile", "copied-file", "new-file-in-copied-dir", "added-file", "dockerignore"],
)
def test_the_tag_changes_with_what_the_build_reads(context: Path, change: Callable[[Path], object]) -> None:
    before = tag(context)
    change(context)
    assert tag(context) != before


def test_the_tag_changes_with_the_build_arguments(context: Path) -> None:
    assert tag(context, BASE_IMAGE="localhost/base:a") != tag(context, BASE_IMAGE="localhost/base:b")
    assert tag(context) != build_inputs.dockerfile_tag(context / "Dockerfile", context, {"target": "build"})


def test_the_tag_ignores_what_the_build_does_not_read(context: Path) -> None:
    before = tag(context)
    (context / "unrelated.txt").write_text("changed\n")
    (context / "app" / "pkg" / "__pycache__").mkdir()
    (context / "app" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (context / "app" / "x.egg-info").mkdir()
    (context / "app" / "x.egg-info" / "PKG-INFO").write_text("")
    assert tag(context) == before


def test_a_missing_copied_path_is_an_error(context: Path) -> None:
    (context / "README.md").unlink()
    with pytest.raises(FileNotFoundError, match=r"README\.md"):
        tag(context)


def test_archives_are_named_after_the_image(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FIBERS_CACHE", str(tmp_path))
    path = images.archive_path("localhost/fibers-job:0123456789ab")
    assert path == tmp_path / "images" / "fibers-job-0123456789ab.tar"


def test_refs_lists_the_node_images_pause_first() -> None:
    built = images.Images(
        base="localhost/base:1", operator="localhost/fibers:2", job="localhost/fibers-job:3",
        spark_operator="localhost/spark-operator:4", pause="localhost/pause:5", coredns="localhost/coredns:6",
    )  # fmt: skip
    refs = built.refs()
    assert next(iter(refs)) == "pause"
    assert refs["job"] == "localhost/fibers-job:3" and refs["spark-operator"] == "localhost/spark-operator:4"
    assert "localhost/base:1" not in refs.values()  # only an input to the others


def test_slim_leaves_no_host_files_caches_or_docs(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for name in (
        "etc/hostname", "etc/resolv.conf", "dev/null", "var/cache/apt/archives/x.deb", "var/lib/apt/lists/Packages",
        "usr/share/doc/bash/copyright", "usr/share/doc/bash/README", "usr/share/man/man1/ls.1.gz",
        "usr/share/locale/de/LC_MESSAGES/x.mo", "etc/apt/sources.list",
    ):  # fmt: skip
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    (root / "var/lib/apt/lists/partial").mkdir()
    (root / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True)
    (root / "etc/apt/apt.conf.d").mkdir(parents=True)
    images._slim(root)
    remaining = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert remaining == {
        "usr/share/doc/bash/copyright",
        "etc/apt/sources.list",  # as debootstrap wrote it
        "etc/dpkg/dpkg.cfg.d/slim",
        "etc/apt/apt.conf.d/docker-clean",
    }
    assert (root / "var/lib/apt/lists/partial").is_dir()


# ---- docker/job-entrypoint.sh, with stand-ins for spark-submit, java and fibers ----------------------

ENTRYPOINT = REPO_ROOT / "docker" / "job-entrypoint.sh"


def stand_in(path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{name} cwd=$(pwd)"\nfor a in "$@"; do echo "$a"; done\n')
    path.chmod(0o755)


@pytest.fixture
def image(tmp_path: Path) -> dict[str, str]:
    spark_home, java_home, bin_dir = tmp_path / "pyspark", tmp_path / "jvm", tmp_path / "bin"
    stand_in(spark_home / "bin" / "spark-submit", "spark-submit")
    stand_in(java_home / "bin" / "java", "java")
    stand_in(bin_dir / "fibers", "fibers")
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SPARK_HOME": str(spark_home),
        "JAVA_HOME": str(java_home),
        "HOME": str(tmp_path),
    }


def entrypoint(env: dict[str, str], *args: str, cwd: Path | None = None) -> list[str]:
    result = subprocess.run(["bash", ENTRYPOINT, *args], env=env, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_driver_runs_spark_submit_in_client_mode_bound_to_the_pod(image: dict[str, str], tmp_path: Path) -> None:
    env = {**image, "SPARK_DRIVER_BIND_ADDRESS": "10.244.0.7"}
    args = ["--properties-file", "/opt/spark/conf/spark.properties", "--class", "org.apache.spark.deploy.PythonRunner"]
    lines = entrypoint(env, "driver", *args, "local:///opt/fibers/transform_job.py", "--spec", '{"a": 1}', cwd=tmp_path)
    assert lines[0] == f"spark-submit cwd={tmp_path}"
    assert lines[1:] == [
        "--conf", "spark.driver.bindAddress=10.244.0.7", "--deploy-mode", "client",
        *args, "local:///opt/fibers/transform_job.py", "--spec", '{"a": 1}',
    ]  # fmt: skip


def test_executor_runs_the_kubernetes_backend_with_spark_s_settings(image: dict[str, str], tmp_path: Path) -> None:
    env = {
        **image,
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver-svc:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.244.0.9",
        "SPARK_EXECUTOR_POD_NAME": "t-1-exec-3",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_CONF_DIR": "/opt/spark/conf",
        "SPARK_CLASSPATH": "/extra/a.jar",
        "SPARK_EXTRA_CLASSPATH": "/opt/fibers/jars/*",
        **{f"SPARK_JAVA_OPT_{i}": f"-Dopt{i}=x y" for i in range(12)},  # 10 and 11 sort after 9
    }
    lines = entrypoint(env, "executor", cwd=tmp_path)
    assert lines[0] == f"java cwd={tmp_path}"
    assert lines[1:13] == [f"-Dopt{i}=x y" for i in range(12)]
    spark_home = image["SPARK_HOME"]
    assert lines[13:] == [
        "-Xms512m", "-Xmx512m",
        "-cp", f"/opt/spark/conf:/extra/a.jar:{spark_home}/jars/*:/opt/fibers/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", "spark://CoarseGrainedScheduler@driver-svc:7078",
        "--executor-id", "3", "--cores", "1", "--app-id", "spark-app-1", "--hostname", "10.244.0.9",
        "--resourceProfileId", "0", "--podName", "t-1-exec-3",
    ]  # fmt: skip


def test_executor_without_spark_s_environment_fails_clearly(image: dict[str, str]) -> None:
    result = subprocess.run(["bash", ENTRYPOINT, "executor"], env=image, capture_output=True, text=True)
    assert result.returncode != 0 and "SPARK_EXECUTOR_MEMORY" in result.stderr


@pytest.mark.parametrize("args", [["consume", "--config", "/etc/fibers/consumer.json"], ["--help"], []])
def test_anything_else_is_the_fibers_command_line(image: dict[str, str], args: list[str]) -> None:
    assert entrypoint(image, *args)[1:] == args


def test_a_published_reference_splits_into_the_chart_s_image_values() -> None:
    assert images.parse("10.0.0.1:5000/fibers-job:0123456789ab@sha256:" + "c" * 64) == (
        "10.0.0.1:5000",
        "fibers-job",
        "0123456789ab",
        "sha256:" + "c" * 64,
    )
    # A registry with a path, an image without a tag: the port's colon is not a tag.
    assert images.parse("registry.example:5000/platform/fibers@sha256:" + "d" * 64) == (
        "registry.example:5000/platform",
        "fibers",
        "",
        "sha256:" + "d" * 64,
    )
