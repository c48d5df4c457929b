"""Where the local stack keeps things, and which versions it runs.

Versions are read from the recipes under tools/ (go.mod and pom.xml files), so each version is
written down exactly once.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def tools_dir() -> Path:
    return Path(os.environ.get("FIBERS_TOOLS_DIR", REPO_ROOT / "tools"))


def cache_dir() -> Path:
    """Built binaries, jars and Go/Maven caches, keyed by version (FIBERS_CACHE overrides)."""
    return Path(os.environ.get("FIBERS_CACHE", Path.home() / ".cache" / "fibers"))


def run_dir() -> Path:
    """A running stack's data, logs and stack.json (FIBERS_STACK_DIR overrides).

    Outside the home directory on purpose: PostgreSQL runs as the postgres user and must be able
    to reach its data directory.
    """
    return Path(os.environ.get("FIBERS_STACK_DIR", f"/tmp/fibers-stack-{os.getuid()}"))


def _go_require(gomod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod.read_text(), re.M)
    if not match:
        raise ValueError(f"{gomod}: no requirement on {module}")
    return match.group(1)


def _pom_property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if not match:
        raise ValueError(f"{pom}: no <{name}> property")
    return match.group(1).strip()


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    ferretdb: str
    kafka: str
    debezium: str
    spark: str
    coredns: str
    spark_operator: str
    apicurio: str
    prometheus_operator: str  # its CRDs only: the stack's Prometheus is Debian's package
    registry: str  # CNCF Distribution: the OCI registry the node pulls images and the chart from


@cache
def versions() -> Versions:
    tools = tools_dir()
    return Versions(
        kubernetes=_go_require(tools / "k8sbin" / "go.mod", "k8s.io/kubernetes"),
        etcd=_go_require(tools / "k8sbin" / "go.mod", "go.etcd.io/etcd/server/v3"),
        ferretdb=_go_require(tools / "ferretdb" / "go.mod", "github.com/FerretDB/FerretDB"),
        kafka=_pom_property(tools / "kafka" / "pom.xml", "kafka.version"),
        debezium=_pom_property(tools / "debezium" / "pom.xml", "debezium.version"),
        spark=_pom_property(tools / "spark-kafka" / "pom.xml", "spark.version"),
        coredns=_go_require(tools / "coredns" / "go.mod", "github.com/coredns/coredns"),
        spark_operator=_go_require(tools / "spark-operator" / "go.mod", "github.com/kubeflow/spark-operator/v2"),
        apicurio=_pom_property(tools / "apicurio" / "pom.xml", "apicurio.version"),
        prometheus_operator=_go_require(
            tools / "prometheus-operator-crds" / "go.mod", "github.com/prometheus-operator/prometheus-operator"
        ),
        registry=_go_require(tools / "registry" / "go.mod", "github.com/distribution/distribution/v3"),
    )


@dataclass(frozen=True)
class Artifacts:
    """Cached locations of every fetched or built component."""

    kubernetes_bin: Path
    ferretdb_bin: Path
    kafka_lib: Path
    connect_plugins: Path
    spark_kafka_jars: Path
    coredns_bin: Path
    spark_operator_bin: Path
    pause_bin: Path
    apicurio: Path
    connect_converters: Path
    registry_bin: Path


def recipe_hash(recipe: str) -> str:
    """Short hash of a recipe folder under tools/: a changed recipe is a new cache entry."""
    digest = hashlib.sha256()
    for path in sorted((tools_dir() / recipe).iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:8]


def helm_version() -> str:
    """helm is for the chart tests only, so it stays out of Versions and Artifacts (a running stack never needs it)."""
    return _go_require(tools_dir() / "helm" / "go.mod", "helm.sh/helm/v3")


def helm_bin() -> Path:
    return cache_dir() / "bin" / f"helm-{helm_version()}-{recipe_hash('helm')}" / "helm"


def argocd_version() -> str:
    """Argo CD is for the GitOps tests and demo only, so like helm it stays out of Versions and Artifacts."""
    return _go_require(tools_dir() / "argocd" / "go.mod", "github.com/argoproj/argo-cd/v3")


def argocd_bin() -> Path:
    """Argo CD's one binary: it is the application-controller or the repo-server by the name it runs as."""
    return cache_dir() / "bin" / f"argocd-{argocd_version()}-{recipe_hash('argocd')}" / "argocd"


def kube_score_version() -> str:
    """kube-score is for the chart test only (a third-party check of the rendered chart), like helm."""
    return _go_require(tools_dir() / "kube-score" / "go.mod", "github.com/zegl/kube-score")


def kube_score_bin() -> Path:
    return cache_dir() / "bin" / f"kube-score-{kube_score_version()}-{recipe_hash('kube-score')}" / "kube-score"


def kueue_version() -> str:
    """Kueue is for the queue-admission test only (built on demand like Argo CD, so a cold CI run that
    skips nothing still builds it once: ~1,400 Go packages, none shared with the other builds)."""
    return _go_require(tools_dir() / "kueue" / "go.mod", "sigs.k8s.io/kueue")


def kueue_bin() -> Path:
    return cache_dir() / "bin" / f"kueue-{kueue_version()}-{recipe_hash('kueue')}" / "manager"


def kueue_module() -> Path:
    """Kueue's module as downloaded: its Helm chart (charts/kueue, CRDs in its templates) comes from here."""
    return go_module_dir("sigs.k8s.io/kueue", kueue_version())


def argocd_module() -> Path:
    """Argo CD's module as downloaded: its CRDs and default argocd-cm (manifests/) come from here."""
    return go_module_dir("github.com/argoproj/argo-cd/v3", argocd_version())


def artifacts() -> Artifacts:
    v, c = versions(), cache_dir()
    return Artifacts(
        kubernetes_bin=c / "bin" / f"k8s-{v.kubernetes}-{recipe_hash('k8sbin')}",
        ferretdb_bin=c / "bin" / f"ferretdb-{v.ferretdb}-{recipe_hash('ferretdb')}" / "ferretdb",
        kafka_lib=c / f"kafka-{v.kafka}-{recipe_hash('kafka')}" / "lib",
        connect_plugins=c / f"connect-plugins-debezium-{v.debezium}-{recipe_hash('debezium')}",
        spark_kafka_jars=c / f"spark-kafka-{v.spark}-{recipe_hash('spark-kafka')}",
        coredns_bin=c / "bin" / f"coredns-{v.coredns}-{recipe_hash('coredns')}" / "coredns",
        spark_operator_bin=c
        / "bin"
        / f"spark-operator-{v.spark_operator}-{recipe_hash('spark-operator')}"
        / "spark-operator",
        pause_bin=c / "bin" / f"pause-{recipe_hash('pause')}" / "pause",
        apicurio=c / f"apicurio-{v.apicurio}-{recipe_hash('apicurio')}",
        connect_converters=c / f"connect-converters-apicurio-{v.apicurio}-{recipe_hash('apicurio-converter')}",
        registry_bin=c / "bin" / f"registry-{v.registry}-{recipe_hash('registry')}" / "registry",
    )


def go_module_dir(module: str, version: str) -> Path:
    """Where `go` unpacked a module in the stack's module cache (capital letters are escaped as !x)."""
    escaped = "".join(f"!{ch.lower()}" if ch.isupper() else ch for ch in module)
    return cache_dir() / "gomod" / f"{escaped}@{version}"


def spark_operator_module() -> Path:
    """The Spark Operator's module: its CRDs (config/crd/bases) and Helm chart (charts/spark-operator-chart)."""
    return go_module_dir("github.com/kubeflow/spark-operator/v2", versions().spark_operator)


def prometheus_operator_crds() -> Path:
    """The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, …) in its module."""
    module = go_module_dir("github.com/prometheus-operator/prometheus-operator", versions().prometheus_operator)
    return module / "example" / "prometheus-operator-crd"
