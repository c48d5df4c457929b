"""The real Kubeflow Spark Operator, installed the way users install it: `helm install` of its own chart.

Chart, CRDs and controller all come from one pinned Go module (tools/spark-operator); the controller
image is built here (see `images`). The webhook is on, as the upstream chart defaults it: it is what
applies a SparkApplication's env, volumes and security contexts to the pods (Fibers also puts them in
pod templates, which work without it; a test turns it off to show that).

Namespaces are chosen by label, not by name, so tests can make as many as they like:
`fibers.dev/spark-jobs=enabled` marks a namespace whose SparkApplications the operator runs. A
namespace without the label is one the Spark Operator does not watch.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fibers_stack import images, releases
from fibers_stack.layout import spark_operator_module

log = logging.getLogger("fibers_stack.spark_operator")

RELEASE = NAMESPACE = "spark-operator"
JOB_NAMESPACE_LABEL = "fibers.dev/spark-jobs"
CONTROLLER_WORKERS = 2  # each submission runs a spark-submit JVM (~220 MB) in the controller pod: 2 cores


def chart() -> Path:
    return spark_operator_module() / "charts" / "spark-operator-chart"


def crds() -> list[Path]:
    return sorted((spark_operator_module() / "config" / "crd" / "bases").glob("*.yaml"))


def values(image: str, *, webhook: bool) -> dict[str, Any]:
    """The release's values; `image` is <registry>/<name>:<tag>@<digest> (the chart has no digest value, so
    the tag carries it: the chart joins them back into the same pinned reference)."""
    registry, repository, tag, digest = images.parse(image)
    tag = f"{tag}@{digest}" if digest else tag
    return {
        "image": {"registry": registry, "repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "controller": {
            "workers": CONTROLLER_WORKERS,
            "uiService": {"enable": False},
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        },
        "webhook": {"enable": webhook, "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
        "spark": {
            "jobNamespaces": [],
            "jobNamespaceSelector": f"{JOB_NAMESPACE_LABEL}=enabled",
            # Fibers brings the drivers' ServiceAccount and RBAC (its chart's jobs ServiceAccount).
            "serviceAccount": {"create": False},
            "rbac": {"create": False},
        },
    }


def install(api: client.ApiClient, kubeconfig: str, image: str, *, webhook: bool = True, run_dir: Path) -> None:
    """Install (or change) the release and wait until SparkApplications are admitted."""
    started = time.monotonic()
    values_file = run_dir / "spark-operator-values.json"
    releases.upgrade_install(kubeconfig, RELEASE, chart(), NAMESPACE, values(image, webhook=webhook), values_file)
    wait_admitted(api)
    log.info("spark operator ready", extra={"webhook": webhook, "seconds": round(time.monotonic() - started, 1)})


def probe_app() -> dict[str, Any]:
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": "admission-probe", "namespace": NAMESPACE},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "sparkVersion": "4.0.0",
            "mainApplicationFile": "local:///probe.py",
            "driver": {"cores": 1, "memory": "512m"},
            "executor": {"cores": 1, "instances": 1, "memory": "512m"},
        },
    }


def wait_admitted(api: client.ApiClient, timeout: float = 120) -> None:
    """A dry-run create passes the webhooks once the webhook has written its CA bundle.

    `helm --wait` is not enough: after a re-install the new webhook pod is Ready at once but writes
    its CA bundle only when it wins its leader lease (up to ~17 s here), and until then every create
    fails with an x509 error. The webhooks are `sideEffects: NoneOnDryRun`, so a dry run exercises them.
    """
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    while True:
        try:
            custom.create_namespaced_custom_object(
                "sparkoperator.k8s.io", "v1beta2", NAMESPACE, "sparkapplications", probe_app(), dry_run="All"
            )
            return
        except ApiException as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SparkApplications are not admitted: {exc.body or exc.reason}") from exc
            time.sleep(0.5)


def label_job_namespace(api: client.ApiClient, namespace: str) -> None:
    """Let the Spark Operator run this namespace's SparkApplications."""
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {JOB_NAMESPACE_LABEL: "enabled"}}})
