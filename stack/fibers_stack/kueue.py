"""Kueue, installed the way a platform team installs it: `helm install` of its own chart.

Chart (charts/kueue, its CRDs among the templates) and manager come from one pinned Go module
(tools/kueue); the manager image is built here (see `images.kueue`). Only the SparkApplication
integration is on, with the feature gate v0.17 puts it behind (Kueue refuses to start with the
framework listed and the gate off). Leaving out `pod`, `deployment` and the rest keeps Kueue's pod
webhook from holding up every pod of the cluster while Kueue is down.

Kueue's SparkApplication webhooks take every SparkApplication of every namespace and fail closed, so
the tests install it only around the queue-admission test and remove it after (`uninstall`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import fibers_stack as stack
from fibers_stack import images, releases, spark_operator
from fibers_stack.layout import kueue_module

log = logging.getLogger("fibers_stack.kueue")

RELEASE, NAMESPACE = "kueue", "kueue-system"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
FRAMEWORK = "sparkoperator.k8s.io/sparkapplication"
FEATURE_GATE = "SparkApplicationIntegration"  # alpha in v0.17: off by default


def chart() -> Path:
    return kueue_module() / "charts" / "kueue"


def manager_config() -> dict[str, Any]:
    """The chart's own manager configuration with the SparkApplication integration as its only framework."""
    default = yaml.safe_load((chart() / "values.yaml").read_text())
    config = yaml.safe_load(default["managerConfig"]["controllerManagerConfigYaml"])
    config["integrations"] = {"frameworks": [FRAMEWORK]}
    return dict(config)


def values(image: str) -> dict[str, Any]:
    """The release's values; `image` is <registry>/<name>:<tag>@<digest> (the chart takes a repository
    and a tag, so the tag carries the digest and the chart joins them back into the same reference)."""
    registry, repository, tag, digest = images.parse(image)
    return {
        "controllerManager": {
            "featureGates": [{"name": FEATURE_GATE, "enabled": True}],
            "manager": {
                "image": {
                    "repository": f"{registry}/{repository}",
                    "tag": f"{tag}@{digest}" if digest else tag,
                    "pullPolicy": "IfNotPresent",
                },
                # The chart asks for half a core; on the stack's two-core node the Spark pods need it.
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            },
        },
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(), sort_keys=False)},
    }


def install(info: stack.StackInfo, api: client.ApiClient) -> None:
    """Build Kueue's image, push it to the stack's registry, install the release, and wait until Kueue's
    webhook answers for SparkApplications."""
    _until(lambda: not _terminating(client.ApiextensionsV1Api(api)), 300, "Kueue's CRDs of an earlier install stay")
    _remove_recreated_roles(api)
    image = images.push(info.oci_registry(), images.kueue())
    run_dir = Path(info.run_dir)
    started = time.monotonic()
    releases.upgrade_install(info.kubeconfig, RELEASE, chart(), NAMESPACE, values(image), run_dir / "kueue-values.json")
    # Ready once its certificates are made and its CA is in the webhook configurations; a dry-run create
    # of a SparkApplication passes both the Spark Operator's webhook and Kueue's then.
    spark_operator.wait_admitted(api)
    log.info("kueue ready", extra={"seconds": round(time.monotonic() - started, 1)})


def uninstall(api: client.ApiClient, kubeconfig: str, timeout: float = 120) -> None:
    """Remove the release and wait until nothing of it is left: its CRDs first, while Kueue still runs
    (they convert their objects through Kueue's own webhook: removed after it, they took minutes to go,
    and a new install meanwhile failed on them), then the release, then its webhooks are waited out."""
    extensions = client.ApiextensionsV1Api(api)
    for crd in _crds(extensions):
        try:
            extensions.delete_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 404:
                raise
    _until(lambda: not _crds(extensions), timeout, "Kueue's CRDs are still there")
    releases.helm(kubeconfig, "uninstall", RELEASE, "--namespace", NAMESPACE)
    admission = client.AdmissionregistrationV1Api(api)

    def webhooks() -> bool:
        listings = (admission.list_mutating_webhook_configuration(), admission.list_validating_webhook_configuration())
        return any(str(c.metadata and c.metadata.name).startswith(f"{RELEASE}-") for x in listings for c in x.items)

    _until(lambda: not webhooks(), timeout, "Kueue's webhook configurations are still there after helm uninstall")
    _remove_recreated_roles(api)


def _remove_recreated_roles(api: client.ApiClient) -> None:
    """Kueue's aggregated ClusterRoles (kueue-batch-admin-role, …) can come back right after helm deleted
    them: the API server's aggregation controller applies their rules server-side, and an apply creates
    what is not there. They come back without helm's release annotations, and the next install refuses
    to adopt them (seen here); so any kueue-* ClusterRole that is not the release's goes."""
    rbac = client.RbacAuthorizationV1Api(api)
    for role in rbac.list_cluster_role().items:
        meta = role.metadata
        if (
            meta
            and str(meta.name).startswith(f"{RELEASE}-")
            and "meta.helm.sh/release-name" not in (meta.annotations or {})
        ):
            try:
                rbac.delete_cluster_role(str(meta.name))
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _crds(extensions: client.ApiextensionsV1Api) -> list[str]:
    names = [str(c.metadata and c.metadata.name) for c in extensions.list_custom_resource_definition().items]
    return [n for n in names if n.endswith(f".{GROUP}")]


def _terminating(extensions: client.ApiextensionsV1Api) -> bool:
    """A Kueue CRD of an earlier install is still being deleted (an install now would fail on it)."""
    items = extensions.list_custom_resource_definition().items
    return any(
        str(c.metadata.name).endswith(f".{GROUP}") and c.metadata.deletion_timestamp for c in items if c.metadata
    )


def _until(done: Callable[[], bool], timeout: float, failure: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.5)


def workloads(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """The Workloads Kueue made in a namespace (one per queued SparkApplication)."""
    try:
        custom = client.CustomObjectsApi(api)
        answer = cast(dict[str, Any], custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads"))
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return list(answer.get("items") or [])
