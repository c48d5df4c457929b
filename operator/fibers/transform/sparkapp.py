"""SparkApplications (sparkoperator.k8s.io/v1beta2): building them and talking to the API about them.

The Spark Operator (Kubeflow, v2.5.0) turns each one into a driver pod that runs `fibers.jobs.transform`
and starts its executors. Fibers never runs spark-submit itself.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fibers import termination
from fibers.jobs.spec import LABEL_TRANSFORM, METRICS_PORT_ENV, result_config_map, written_for
from fibers.kube import Kube, NotOurs, adopt
from fibers.kubeapi import ApiError, path
from fibers.redact import redact, truncate
from fibers.transform.spec import Defaults, secret_envs
from fibers.watches import Child

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
API = f"{GROUP}/{VERSION}"
# Watched: a run's change, or one of its pods' (a driver that cannot start), brings its Transform back.
CHILDREN = (Child(API, PLURAL, LABEL_TRANSFORM), Child("v1", "pods", LABEL_TRANSFORM))
APP_LABEL = "sparkoperator.k8s.io/app-name"  # the Spark Operator's label on a run's driver and executors
LABEL_TRIGGER = "fibers.dev/trigger"
JOB_ENTRY = "local:///opt/fibers/transform_job.py"  # the job image's shim for `python -m fibers.jobs.transform`
JOB_JARS = "/opt/fibers/jars/*"  # the job image's spark-sql-kafka jars, as a Java class path entry
DRIVER_CONTAINER = "spark-kubernetes-driver"  # the names the Spark Operator gives Spark for the templates
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
JOB_USER = 10001  # the job image's user and group (fibers:fibers)
TMP_VOLUME = "tmp"
# A streaming run's driver serves its micro-batches' figures here (port name `metrics`, for the chart's
# PodMonitor; fibers.jobs.progress).
DRIVER_METRICS_PORT = 9405

# applicationState.state values of the Spark Operator (v2.5.0 api/v1beta2), grouped the way Fibers
# reports them. Only COMPLETED and FAILED are final: SUBMISSION_FAILED and FAILING always move on, to
# FAILED or (restartPolicy OnFailure) to another attempt; SUCCEEDING moves on to COMPLETED.
FINISHED_OK = {"COMPLETED"}
FINISHED_FAILED = {"FAILED"}
FAILING = {"FAILING", "SUBMISSION_FAILED"}
RUNNING = {"RUNNING", "SUCCEEDING"}
# Until the driver pod runs: "" (the Spark Operator has not submitted it yet), SUBMITTED (the driver pod
# exists but is not running), SUBMISSION_FAILED (spark-submit failed; retried or failed for good).
WAITING_FOR_DRIVER = {"", "SUBMITTED", "SUBMISSION_FAILED"}
# A driver ran and ended: its job has written the result ConfigMap (or the error) if it could.
DRIVER_ENDED = {"SUCCEEDING", "COMPLETED", "FAILING", "FAILED"}
DRIVER_FAILED = {"FAILING", "FAILED"}  # the driver exited non-zero
# spec.suspend is true (the run waits for Kueue's admission, or Kueue took its quota back): the Spark
# Operator has deleted or never made its pods. Admission sets suspend false; the run then goes
# RESUMING (or INVALIDATING, PENDING_RERUN: Kueue also labels the pods) to SUBMITTED.
SUSPENDED_BY_SPEC = {"SUSPENDING", "SUSPENDED"}
# Kueue (v0.17, its SparkApplication integration): the LocalQueue a run is queued in, and the label on
# the Workload Kueue makes for it, naming the SparkApplication's uid.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_JOB_UID = "kueue.x-k8s.io/job-uid"
WORKLOADS = ("kueue.x-k8s.io/v1beta2", "workloads")
NO_WORKLOAD = "no Kueue Workload for it yet (if none comes, is Kueue installed with its SparkApplication integration?)"


def state_of(app: dict[str, Any]) -> str:
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state") or "")


def finished(app: dict[str, Any]) -> bool:
    return state_of(app) in FINISHED_OK | FINISHED_FAILED


def executor_states(app: dict[str, Any]) -> dict[str, int]:
    """How many executors are in each state (PENDING, RUNNING, COMPLETED, FAILED, UNKNOWN)."""
    counts: dict[str, int] = {}
    for state in ((app.get("status") or {}).get("executorState") or {}).values():
        counts[str(state)] = counts.get(str(state), 0) + 1
    return dict(sorted(counts.items()))


# The restricted Pod Security Standard, as the job image expects it: its numeric non-root user, a
# read-only root filesystem (PySpark writes only to /tmp, an emptyDir), nothing more.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": JOB_USER,
    "runAsGroup": JOB_USER,
    "fsGroup": JOB_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": JOB_USER,
    "runAsGroup": JOB_USER,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_template(
    container: str,
    *,
    env: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    api_token: bool,
) -> dict[str, Any]:
    """A Spark pod template (spec.driver.template / spec.executor.template).

    Spark builds the pods from it itself, so what it carries reaches the pods whether or not the Spark
    Operator's mutating webhook runs. The same settings in `driver.env`, `driver.securityContext`,
    `spec.volumes`, … are applied by that webhook only, and silently dropped without it.
    """
    spec: dict[str, Any] = {
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "volumes": [{"name": TMP_VOLUME, "emptyDir": {}}, *copy.deepcopy(volumes)],
        "containers": [
            {
                "name": container,
                "terminationMessagePolicy": termination.POLICY,  # the driver writes its error there
                **({"env": copy.deepcopy(env)} if env else {}),
                "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
                "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}, *copy.deepcopy(mounts)],
            }
        ],
    }
    if not api_token:
        spec["automountServiceAccountToken"] = False
    return {"spec": spec}


def _class_path(spark_conf: dict[str, str], key: str) -> str:
    """The job image's Kafka jars after whatever class path the Transform sets itself."""
    own = spark_conf.get(key)
    return f"{own}:{JOB_JARS}" if own else JOB_JARS


def owned_by(app: dict[str, Any], uid: str) -> bool:
    """Whether the Transform of that uid owns the SparkApplication (its owner reference, set by `build`)."""
    return any(ref.get("uid") == uid for ref in (app.get("metadata") or {}).get("ownerReferences") or [])


def build(
    transform: dict[str, Any], *, run: str, job: dict[str, Any], trigger: str, defaults: Defaults
) -> dict[str, Any]:
    """The SparkApplication of one run, in the shape the Spark Operator v2.5.0 CRD accepts.

    Secrets (MongoDB URIs) reach driver and executors as secretKeyRef environment variables in the
    pod templates: by reference, never by value. Nothing goes into `driver.env`, `spec.volumes` or the
    security context fields: the webhook would append those to the template's, duplicating the
    variables and the `tmp` volume (a pod with two volumes of one name is rejected).
    """
    meta, spec = transform["metadata"], transform["spec"]
    spark = spec.get("spark") or {}
    driver, executor = spark.get("driver") or {}, spark.get("executor") or {}
    streaming = spec.get("mode") == "streaming"
    service_account = spark.get("serviceAccount") or defaults.service_account
    env = secret_envs(spec)
    volumes, mounts = list(spark.get("volumes") or []), list(spark.get("volumeMounts") or [])
    labels = {LABEL_TRANSFORM: meta["name"]}
    queue = spec.get("queue")
    spark_conf = {str(k): str(v) for k, v in (spark.get("sparkConf") or {}).items()}
    # spark-submit puts these on the JVM's class path at launch; jars a running driver adds later
    # (spark.jars in the session builder) are shipped to executors but never reach the driver's own
    # class loader, so the kafka source would be missing there.
    spark_conf["spark.driver.extraClassPath"] = _class_path(spark_conf, "spark.driver.extraClassPath")
    spark_conf["spark.executor.extraClassPath"] = _class_path(spark_conf, "spark.executor.extraClassPath")

    def pods(side: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "cores": int(side.get("cores", 1)),
            "memory": str(side.get("memory") or defaults.memory),
            "labels": dict(labels),
        }
        # Kueue counts a pod's CPU from coreRequest only (cores is Spark's parallelism, not a request):
        # a queued run always carries one.
        core_request = side.get("coreRequest") or defaults.core_request or (fields["cores"] if queue else None)
        if core_request:
            fields["coreRequest"] = str(core_request)
        if service_account:
            fields["serviceAccount"] = service_account
        return fields

    driver_spec = pods(driver)
    # The driver talks to the API (executor pods, its result ConfigMap); executors never do.
    driver_spec["template"] = pod_template(DRIVER_CONTAINER, env=env, volumes=volumes, mounts=mounts, api_token=True)
    if streaming:
        [container] = driver_spec["template"]["spec"]["containers"]
        container.setdefault("env", []).append({"name": METRICS_PORT_ENV, "value": str(DRIVER_METRICS_PORT)})
        container["ports"] = [{"name": "metrics", "containerPort": DRIVER_METRICS_PORT, "protocol": "TCP"}]
    executor_spec = {**pods(executor), "instances": int(executor.get("instances", 1))}
    executor_spec["template"] = pod_template(
        EXECUTOR_CONTAINER, env=env, volumes=volumes, mounts=mounts, api_token=False
    )
    application = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SparkApplication",
        "metadata": {
            "name": run,
            "namespace": meta["namespace"],
            "labels": {
                LABEL_TRANSFORM: meta["name"],
                LABEL_TRIGGER: trigger,
                **({QUEUE_LABEL: queue} if queue else {}),
            },
        },
        "spec": {
            # Queued: created suspended, so nothing runs before Kueue admits it (Kueue's webhook would
            # set it too; set here, a run never starts unadmitted whatever that webhook's state).
            **({"suspend": True} if queue else {}),
            "type": "Python",
            "mode": "cluster",
            "image": spark.get("image") or defaults.image,
            "imagePullPolicy": defaults.image_pull_policy,
            "mainApplicationFile": JOB_ENTRY,
            "arguments": ["--spec", json.dumps(job, sort_keys=True)],
            "sparkVersion": defaults.spark_version,
            "sparkConf": spark_conf,
            # No timeToLiveSeconds: finished runs are kept and deleted by the history limits.
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
            "executor": executor_spec,
        },
    }
    adopt(application, transform)
    return application


class SparkApplications:
    """Namespaced CRUD on SparkApplications, and what their runs leave behind (result ConfigMap, driver pod)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def list_for(self, namespace: str, transform: str, uid: str) -> list[dict[str, Any]]:
        """The Transform's runs: labelled for it and owned by it (its uid). One only labelled — a run copied
        by hand to debug, one of an earlier Transform of that name — is not its run: never read as one,
        trimmed as history or deleted as an extra query."""
        items = await self.kube.items(path(API, PLURAL, namespace), labelSelector=f"{LABEL_TRANSFORM}={transform}")
        return sorted((a for a in items if owned_by(a, uid)), key=lambda a: a["metadata"]["creationTimestamp"])

    async def create(self, app: dict[str, Any]) -> bool:
        """Create it; False when it already exists as this Transform's (a retried submission is not a second
        one). One of that name it does not own is not taken for its run (NotOurs)."""
        meta = app["metadata"]
        try:
            await self.kube.call("POST", path(API, PLURAL, meta["namespace"]), body=app)
        except ApiError as exc:
            if exc.status != 409:
                raise
            found = await self.kube.read(path(API, PLURAL, meta["namespace"], meta["name"]))
            if found is not None and not owned_by(found, meta["ownerReferences"][0]["uid"]):
                raise NotOurs(
                    f"SparkApplication {meta['namespace']}/{meta['name']} exists and is not this Transform's "
                    "(no owner reference to it): it is neither taken for the run nor deleted; delete it to let "
                    "the run start"
                ) from None
            return False
        return True

    async def delete(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete a run; with `uid`, only the one listed (not one made again under its name since)."""
        await self.kube.delete(path(API, PLURAL, namespace, name), propagation="Background", uid=uid)

    async def result(self, namespace: str, transform: str, run: str) -> dict[str, str]:
        """What the job reported in its result ConfigMap, if it wrote one: a ConfigMap of that name that the
        job did not write (not labelled for this Transform) is not its result."""
        cm = await self.kube.read(path("v1", "configmaps", namespace, result_config_map(run)))
        return dict(cm.get("data") or {}) if cm is not None and written_for(cm, transform) else {}

    async def delete_result(self, namespace: str, transform: str, run: str) -> None:
        """Delete the run's result ConfigMap, the one read (its uid), and only if the job wrote it."""
        url = path("v1", "configmaps", namespace, result_config_map(run))
        cm = await self.kube.read(url)
        if cm is not None and written_for(cm, transform):
            await self.kube.delete(url, uid=cm["metadata"]["uid"])

    async def driver_message(self, app: dict[str, Any]) -> str:
        """The driver container's termination message: the job's error line, or its log's tail
        (FallbackToLogsOnError) when it died before it could say; "" when there is none to read."""
        namespace = app["metadata"]["namespace"]
        pod_name = ((app.get("status") or {}).get("driverInfo") or {}).get("podName")
        if not pod_name:
            return ""
        pod = await self.kube.read(path("v1", "pods", namespace, pod_name))
        for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == DRIVER_CONTAINER and terminated.get("exitCode") and terminated.get("message"):
                return truncate(redact(str(terminated["message"]).strip(), ()), 2048)
        return ""

    async def admission(self, app: dict[str, Any]) -> str:
        """What Kueue says of a queued run's Workload: why it is not admitted yet (its QuotaReserved
        condition's message), or that no Workload exists for it (Kueue not installed, or its
        SparkApplication integration off: then nothing will ever admit the run)."""
        meta = app["metadata"]
        try:
            workloads = await self.kube.items(
                path(*WORKLOADS, meta["namespace"]), labelSelector=f"{WORKLOAD_JOB_UID}={meta.get('uid', '')}"
            )
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            workloads = []  # Kueue's CRDs are not served here (or the operator may not read them)
        if not workloads:
            return NO_WORKLOAD
        for condition in (workloads[0].get("status") or {}).get("conditions") or []:
            if condition.get("type") == "QuotaReserved" and condition.get("status") != "True":
                return truncate(str(condition.get("message") or condition.get("reason") or ""), 512)
        return ""
