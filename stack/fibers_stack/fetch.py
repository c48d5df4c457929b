"""Fetch or build each local-stack component into the cache, only when it is missing.

Everything comes from package registries through their ordinary clients: Go modules through
`go build`, jars through Maven. Each component is built into a temporary directory and renamed
into place, so an interrupted build never looks cached.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fibers_stack.layout import (
    argocd_bin,
    argocd_module,
    argocd_version,
    artifacts,
    cache_dir,
    helm_bin,
    helm_version,
    kube_score_bin,
    kube_score_version,
    kueue_bin,
    kueue_version,
    prometheus_operator_crds,
    spark_operator_module,
    tools_dir,
    versions,
)
from fibers_stack.process import log_tail

log = logging.getLogger("fibers_stack.fetch")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run a build command; its output goes to a log file and is shown only when it fails."""
    log_file = cache_dir() / "build.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log.info("running %s", " ".join(argv[:3]) + " …", extra={"cwd": str(cwd)})
    with open(log_file, "ab") as out:
        result = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=out)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed in {cwd}; last lines of {log_file}:\n{log_tail(log_file)}")


def _go_env() -> dict[str, str]:
    c = cache_dir()
    return {
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-buildvcs=false -trimpath -mod=readonly",
        "GOMODCACHE": str(c / "gomod"),
        "GOCACHE": str(c / "gobuild"),
    }


def _mvn_copy(project: str, out: Path) -> None:
    _run(
        [
            "mvn",
            "-B",
            "-q",
            f"-Dmaven.repo.local={cache_dir() / 'm2'}",
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={out}",
        ],
        cwd=tools_dir() / project,
    )


def _build_into(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into target.tmp, then rename: a half-built component is never taken for cached."""
    if target.exists():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    build(tmp)
    tmp.rename(target)
    log.info("built %s", target.name, extra={"seconds": round(time.monotonic() - started, 1)})
    return target


def _go_binary(binary: Path, recipe: str, package: str, what: str, ldflags: str = "-s -w") -> Path:
    """Build one Go command from its recipe under tools/ into binary's own cache folder."""

    def build(out: Path) -> None:
        log.info("building %s", what)
        _run(
            ["go", "build", "-ldflags", ldflags, "-o", str(out / binary.name), package], tools_dir() / recipe, _go_env()
        )

    _build_into(binary.parent, build)
    return binary


def kubernetes() -> Path:
    v = versions().kubernetes
    minor = v.split(".")[1]
    stamp = "k8s.io/component-base/version"
    client = "k8s.io/client-go/pkg/version"
    ldflags = " ".join(
        [
            "-s -w",
            f"-X {stamp}.gitVersion={v} -X {stamp}.gitMajor=1 -X {stamp}.gitMinor={minor}",
            f"-X {stamp}.gitTreeState=clean -X {stamp}.buildDate=1970-01-01T00:00:00Z",
            f"-X {client}.gitVersion={v} -X {client}.gitMajor=1 -X {client}.gitMinor={minor}",
        ]
    )

    def build(out: Path) -> None:
        cwd = tools_dir() / "k8sbin"
        for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"):
            log.info("building %s %s (cold: 5-15 minutes each on 2 cores)", cmd, v)
            _run(
                ["go", "build", "-ldflags", ldflags, "-o", str(out / cmd), f"k8s.io/kubernetes/cmd/{cmd}"],
                cwd,
                _go_env(),
            )
        _run(
            ["go", "build", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
            cwd,
            _go_env(),
        )

    return _build_into(artifacts().kubernetes_bin, build)


def kubernetes_if_built() -> Path | None:
    """The Kubernetes binaries when they are in the cache (a teardown must not start a build)."""
    path = artifacts().kubernetes_bin
    return path if path.exists() else None


def ferretdb() -> Path:
    """The FerretDB binary (our small main package over FerretDB's embeddable API)."""
    v = versions().ferretdb
    return _go_binary(artifacts().ferretdb_bin, "ferretdb", ".", f"ferretdb {v} (cold: about a minute)")


def kafka() -> Path:
    lib = artifacts().kafka_lib
    _build_into(lib.parent, lambda out: _mvn_copy("kafka", out / "lib"))
    return lib


def connect_plugins() -> Path:
    """Debezium in a plugin directory of its own, so Connect loads it in an isolated class loader."""
    return _build_into(
        artifacts().connect_plugins, lambda out: _mvn_copy("debezium", out / "debezium-connector-postgres")
    )


def connect_converters() -> Path:
    """Apicurio's Avro converter in a plugin directory of its own, next to Debezium's on Connect's plugin path."""
    return _build_into(
        artifacts().connect_converters, lambda out: _mvn_copy("apicurio-converter", out / "apicurio-converter")
    )


def apicurio() -> Path:
    """Apicurio Registry's distribution, unpacked: the runner jar (see `apicurio_runner`) and its lib/."""

    def build(out: Path) -> None:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            _mvn_copy("apicurio", Path(tmp))
            [archive] = Path(tmp).glob("*.tar.gz")
            with tarfile.open(archive) as tar:
                tar.extractall(out, filter="data")
            archive.unlink()
        if not apicurio_runner(out).is_file():
            raise RuntimeError(f"{out}: no {apicurio_runner(out).name} in the Apicurio distribution")

    return _build_into(artifacts().apicurio, build)


def apicurio_runner(home: Path) -> Path:
    """The Quarkus runner jar at the top of the unpacked distribution (its lib/ sits next to it)."""
    return home / f"apicurio-registry-app-{versions().apicurio}-runner.jar"


def spark_kafka_jars() -> Path:
    return _build_into(artifacts().spark_kafka_jars, lambda out: _mvn_copy("spark-kafka", out))


def coredns() -> Path:
    """CoreDNS, unmodified: the node's cluster DNS."""
    v = versions().coredns
    return _go_binary(artifacts().coredns_bin, "coredns", "github.com/coredns/coredns", f"coredns {v} (cold: ~3 min)")


def spark_operator() -> Path:
    """The Kubeflow Spark Operator's controller/webhook command (its chart and CRDs come with the module)."""
    v = versions().spark_operator
    package = "github.com/kubeflow/spark-operator/v2/cmd/operator"
    return _go_binary(artifacts().spark_operator_bin, "spark-operator", package, f"spark-operator {v} (cold: ~2 min)")


def spark_operator_source() -> Path:
    """The Spark Operator's module as downloaded (its CRDs and chart), without building anything: what a
    check of Fibers' SparkApplications against the real CRD needs on a fresh clone (seconds, not a build)."""
    module = spark_operator_module()
    if not module.exists():
        log.info("downloading the Spark Operator module for its CRDs and chart")
        _run(
            ["go", "mod", "download", "github.com/kubeflow/spark-operator/v2"],
            tools_dir() / "spark-operator",
            _go_env(),
        )
    return module


def registry() -> Path:
    """CNCF Distribution's `registry` command, unmodified: the stack's OCI registry (see `fibers_stack.registry`)."""
    v = versions().registry
    package = "github.com/distribution/distribution/v3/cmd/registry"
    ldflags = f"-s -w -X github.com/distribution/distribution/v3/version.version={v}"
    return _go_binary(artifacts().registry_bin, "registry", package, f"registry {v} (cold: ~2 min)", ldflags)


def pause() -> Path:
    """The pod sandbox binary (tools/pause)."""
    return _go_binary(artifacts().pause_bin, "pause", ".", "pause")


def helm() -> Path:
    """helm v3, with its default Kubernetes version set to the stack's (helm v3 otherwise assumes 1.20)."""
    binary, version = helm_bin(), helm_version()
    minor = versions().kubernetes.split(".")[1]
    ldflags = " ".join(
        [
            "-s -w",
            f"-X helm.sh/helm/v3/internal/version.version={version}",
            *(f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMajor=1" for pkg in ("chartutil", "lint/rules")),
            *(f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersionMinor={minor}" for pkg in ("chartutil", "lint/rules")),
        ]
    )

    def build(out: Path) -> None:
        log.info("building helm %s (cold: a few minutes)", version)
        _run(
            ["go", "build", "-ldflags", ldflags, "-o", str(out / binary.name), "helm.sh/helm/v3/cmd/helm"],
            tools_dir() / "helm",
            _go_env(),
        )

    _build_into(binary.parent, build)
    return binary


def kube_score() -> Path:
    """kube-score, unmodified: the chart test's third-party check of what the chart renders."""
    binary, version = kube_score_bin(), kube_score_version()
    package, ldflags = "github.com/zegl/kube-score/cmd/kube-score", f"-s -w -X main.version={version}"
    return _go_binary(binary, "kube-score", package, f"kube-score {version} (cold: ~1.5 min)", ldflags)


def argocd() -> Path:
    """Argo CD v3, built inside its own module so that its go.mod's replace directives apply.

    The module is downloaded into the stack's module cache, copied somewhere writable, given the
    recipe's loopback patch (tools/argocd) and built from ./cmd: one binary, about 6 minutes cold
    on two cores, 140 MiB.
    """
    binary, version = argocd_bin(), argocd_version()

    def build(out: Path) -> None:
        module = argocd_module()
        if not module.exists():
            log.info("downloading Argo CD %s", version)
            _run(["go", "mod", "download", "github.com/argoproj/argo-cd/v3"], tools_dir() / "argocd", _go_env())
        src = out / "src"
        shutil.copytree(module, src)
        for path in [src, *src.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        _run(["patch", "-p1", "-i", str(tools_dir() / "argocd" / "metrics-loopback.patch")], src)
        log.info("building Argo CD %s (cold: about 6 minutes on 2 cores)", version)
        stamp = "github.com/argoproj/argo-cd/v3/common"
        ldflags = f"-s -w -X {stamp}.version={version.lstrip('v')} -X {stamp}.gitTreeState=clean"
        _run(["go", "build", "-ldflags", ldflags, "-o", str(out / binary.name), "./cmd"], src, _go_env())
        shutil.rmtree(src)

    _build_into(binary.parent, build)
    return binary


def kueue() -> Path:
    """Kueue's manager (sigs.k8s.io/kueue/cmd/kueue), built from the recipe's module with Kueue's own
    versions (it has no replace directives): about 1,400 packages, none shared with the other builds."""
    binary, version = kueue_bin(), kueue_version()
    stamp = "sigs.k8s.io/kueue/pkg/version"
    ldflags = f"-s -w -X {stamp}.GitVersion={version}"
    what = f"kueue {version} (cold: ~10 min on 2 cores)"
    return _go_binary(binary, "kueue", "sigs.k8s.io/kueue/cmd/kueue", what, ldflags)


def monitoring_crds() -> Path:
    """The Prometheus Operator's CRDs, from its Go module (downloaded, not built: ~4 MB)."""
    crds = prometheus_operator_crds()
    if not crds.exists():
        module = "github.com/prometheus-operator/prometheus-operator"
        log.info("downloading the %s module for its CRDs", module)
        _run(["go", "mod", "download", module], tools_dir() / "prometheus-operator-crds", _go_env())
    return crds


def container_images() -> Path:
    """The node's images (see `images`), built from the binaries above: keep it last in COMPONENTS."""
    from fibers_stack import images  # imported here: images builds on this module

    images.build_all()
    return images.images_dir()


COMPONENTS: dict[str, Callable[[], Path]] = {
    "kafka": kafka,
    "connect-plugins": connect_plugins,
    "spark-kafka": spark_kafka_jars,
    "ferretdb": ferretdb,
    "kubernetes": kubernetes,
    "helm": helm,
    "argocd": argocd,
    "kube-score": kube_score,
    "kueue": kueue,
    "coredns": coredns,
    "spark-operator": spark_operator,
    "pause": pause,
    "registry": registry,
    "apicurio": apicurio,
    "connect-converters": connect_converters,
    "monitoring-crds": monitoring_crds,
    "images": container_images,  # last: it needs pause, coredns and spark-operator
}


# Cold build minutes measured on the project machine (2 cores; README "The local stack"): what a person
# waiting on a fresh machine is told to expect. Components not listed are downloads of a few seconds.
COLD_MINUTES = {
    "kubernetes": 4.5,
    "coredns": 1.4,
    "spark-operator": 1.2,
    "helm": 1.1,
    "ferretdb": 0.7,
    "registry": 1.8,
    "argocd": 4.0,
    "kueue": 10.0,
    "images": 3.1,
}
# Built only when asked for (`fibers-stack fetch argocd`) or first needed: the GitOps tests build Argo CD,
# the chart test kube-score and the queue-admission test Kueue themselves, so neither `make demo` nor
# `fibers-stack up` waits for them.
ON_DEMAND = ("argocd", "kube-score", "kueue")


def fetch_all(names: list[str] | None = None) -> None:
    """Each component in order, with a line per component a person reads: which, how long it took, and
    before a cold build, how long it usually takes."""
    chosen = names or [name for name in COMPONENTS if name not in ON_DEMAND]
    started = time.monotonic()
    for index, name in enumerate(chosen, 1):
        step = f"[{index}/{len(chosen)}] {name}"
        estimate = COLD_MINUTES.get(name)
        log.info(f"{step}: checking the cache" + (f" (a cold build takes about {estimate:g} min)" if estimate else ""))
        began = time.monotonic()
        COMPONENTS[name]()
        log.info(f"{step}: ready after {_elapsed(time.monotonic() - began)}")
    log.info(f"all {len(chosen)} components ready after {_elapsed(time.monotonic() - started)}")


def _elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
