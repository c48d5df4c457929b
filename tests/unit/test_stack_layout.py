"""The stack reads its versions from the recipes in tools/ and keys the cache by recipe content."""

from __future__ import annotations

from pathlib import Path

import pytest

from fibers_stack import layout


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    recipes = (
        "k8sbin",
        "ferretdb",
        "kafka",
        "debezium",
        "spark-kafka",
        "coredns",
        "spark-operator",
        "pause",
        "prometheus-operator-crds",
        "registry",
    )
    for name in (*recipes, "apicurio", "apicurio-converter"):
        (tmp_path / name).mkdir()
    (tmp_path / "coredns" / "go.mod").write_text("module c\n\nrequire github.com/coredns/coredns v1.14.7\n")
    (tmp_path / "spark-operator" / "go.mod").write_text(
        "module s\n\nrequire github.com/kubeflow/spark-operator/v2 v2.5.0\n"
    )
    (tmp_path / "prometheus-operator-crds" / "go.mod").write_text(
        "// a comment\nmodule p\n\nrequire github.com/prometheus-operator/prometheus-operator v0.85.0\n"
    )
    (tmp_path / "registry" / "go.mod").write_text(
        "module r\n\nrequire github.com/distribution/distribution/v3 v3.1.2\n"
    )
    (tmp_path / "k8sbin" / "go.mod").write_text(
        "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.6.5\n\tk8s.io/kubernetes v1.35.4\n)\n"
    )
    (tmp_path / "ferretdb" / "go.mod").write_text("module y\n\nrequire github.com/FerretDB/FerretDB v1.24.2\n")
    (tmp_path / "kafka" / "pom.xml").write_text("<properties><kafka.version>4.1.1</kafka.version></properties>")
    (tmp_path / "debezium" / "pom.xml").write_text("<debezium.version> 3.3.2.Final </debezium.version>")
    (tmp_path / "spark-kafka" / "pom.xml").write_text("<spark.version>4.0.0</spark.version>")
    (tmp_path / "apicurio" / "pom.xml").write_text("<apicurio.version>2.6.13.Final</apicurio.version>")
    (tmp_path / "apicurio-converter" / "pom.xml").write_text("<apicurio.version>2.6.13.Final</apicurio.version>")
    monkeypatch.setenv("FIBERS_TOOLS_DIR", str(tmp_path))
    monkeypatch.setenv("FIBERS_CACHE", str(tmp_path / "cache"))
    layout.versions.cache_clear()
    yield tmp_path
    layout.versions.cache_clear()


def test_versions_come_from_the_recipes(tools: Path) -> None:
    assert layout.versions() == layout.Versions(
        kubernetes="v1.35.4",
        etcd="v3.6.5",
        ferretdb="v1.24.2",
        kafka="4.1.1",
        debezium="3.3.2.Final",
        spark="4.0.0",
        coredns="v1.14.7",
        spark_operator="v2.5.0",
        apicurio="2.6.13.Final",
        prometheus_operator="v0.85.0",
        registry="v3.1.2",
    )


def test_single_line_require_parses(tools: Path) -> None:
    assert layout.versions().ferretdb == "v1.24.2"


def test_missing_version_is_a_clear_error(tools: Path) -> None:
    (tools / "kafka" / "pom.xml").write_text("<project/>")
    with pytest.raises(ValueError, match=r"kafka.version"):
        layout.versions()


def test_a_changed_recipe_is_a_new_cache_entry(tools: Path) -> None:
    before = layout.artifacts().ferretdb_bin
    (tools / "ferretdb" / "main.go").write_text("package main\n")
    after = layout.artifacts().ferretdb_bin
    assert before != after
    assert after.parent.name.startswith("ferretdb-v1.24.2-")
    assert layout.artifacts().kafka_lib == layout.artifacts().kafka_lib  # stable when nothing changed


def test_the_registry_and_its_converter_are_keyed_by_their_own_recipes(tools: Path) -> None:
    registry, converters = layout.artifacts().apicurio, layout.artifacts().connect_converters
    assert registry.name.startswith("apicurio-2.6.13.Final-")
    assert converters.name.startswith("connect-converters-apicurio-2.6.13.Final-")
    (tools / "apicurio-converter" / "pom.xml").write_text("<apicurio.version>2.6.13.Final</apicurio.version><!-- -->")
    assert layout.artifacts().connect_converters != converters
    assert layout.artifacts().apicurio == registry
