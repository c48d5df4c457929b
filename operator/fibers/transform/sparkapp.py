"""SparkApplications (sparkoperator.k8s.io/v1beta2): building them and talking to the API about them.

The Spark Operator turns each one into a driver pod that runs `fibers.jobs.transform`. The
operator never runs spark-submit itself.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fibers.api import API_VERSION
from fibers.transform.spec import KIND, Defaults, secret_envs

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
LABEL_TRANSFORM = "fibers.dev/transform"
LABEL_TRIGGER = "fibers.dev/trigger"
JOB_ENTRY = "local:///opt/fibers/transform_job.py"  # the job image's shim for `python -m fibers.jobs.transform`

# applicationState.state values, grouped the way Fibers reports them.
FINISHED_OK = {"COMPLETED"}
FINISHED_FAILED = {"FAILED", "SUBMISSION_FAILED"}
RUNNING = {"RUNNING", "SUCCEEDING", "FAILING"}


def state_of(app: dict[str, Any]) -> str:
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state") or "")


def finished(app: dict[str, Any]) -> bool:
    return state_of(app) in FINISHED_OK | FINISHED_FAILED


def build(
    transform: dict[str, Any], *, run: str, job: dict[str, Any], trigger: str, defaults: Defaults
) -> dict[str, Any]:
    meta, spec = transform["metadata"], transform["spec"]
    spark = spec.get("spark") or {}
    driver, executor = spark.get("driver") or {}, spark.get("executor") or {}
    streaming = spec.get("mode") == "streaming"
    service_account = spark.get("serviceAccount") or defaults.service_account
    driver_spec: dict[str, Any] = {
        "cores": driver.get("cores", 1),
        "memory": driver.get("memory", "1g"),
        "labels": {LABEL_TRANSFORM: meta["name"]},
        "env": secret_envs(spec),
    }
    if service_account:
        driver_spec["serviceAccount"] = service_account
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SparkApplication",
        "metadata": {
            "name": run,
            "namespace": meta["namespace"],
            "labels": {LABEL_TRANSFORM: meta["name"], LABEL_TRIGGER: trigger},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": spark.get("image") or defaults.image,
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": JOB_ENTRY,
            "arguments": ["--spec", json.dumps(job, sort_keys=True)],
            "sparkVersion": defaults.spark_version,
            "sparkConf": dict(spark.get("sparkConf") or {}),
            "restartPolicy": (
                {
                    "type": "OnFailure",
                    "onFailureRetries": 3,
                    "onFailureRetryInterval": 10,
                    "onSubmissionFailureRetries": 3,
                    "onSubmissionFailureRetryInterval": 10,
                }
                if streaming
                else {"type": "Never"}
            ),
            "driver": driver_spec,
            "executor": {
                "cores": executor.get("cores", 1),
                "memory": executor.get("memory", "1g"),
                "instances": executor.get("instances", 1),
                "labels": {LABEL_TRANSFORM: meta["name"]},
            },
        },
    }


class SparkApplications:
    """Namespaced CRUD on SparkApplications, run in worker threads."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def list_for(self, namespace: str, transform: str) -> list[dict[str, Any]]:
        result = await asyncio.to_thread(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            label_selector=f"{LABEL_TRANSFORM}={transform}",
        )
        items: list[dict[str, Any]] = cast(dict[str, Any], result)["items"]
        return sorted(items, key=lambda a: a["metadata"]["creationTimestamp"])

    async def create(self, app: dict[str, Any]) -> bool:
        """Create it; False when it already exists (a retried submission is not a second one)."""
        try:
            await asyncio.to_thread(
                self.custom.create_namespaced_custom_object, GROUP, VERSION, app["metadata"]["namespace"], PLURAL, app
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def delete(self, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                propagation_policy="Background",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def result(self, namespace: str, run: str) -> dict[str, str]:
        """What the job reported in its result ConfigMap, if it wrote one."""
        try:
            cm = await asyncio.to_thread(self.core.read_namespaced_config_map, f"{run}-result", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(cm.data or {})
