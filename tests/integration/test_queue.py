"""Transform runs admitted by Kueue (v0.17, its SparkApplication integration) on the real stack.

Kueue is installed from its own chart for this module only (its SparkApplication webhooks take every
SparkApplication of the cluster and fail closed) and removed afterwards, its queues first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from fibers.conditions import parse_time
from fibers_stack import StackInfo, kueue
from tests.helpers import Resources, produce, spark_apps, wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.transform

QUEUE = "q"
# One run asks Kueue for its driver and one executor, 200m CPU (the operator's coreRequest) and 512Mi
# (Kueue counts the JVM heap, not Spark's overhead) each: quota for one run and not for two.
ONE_RUN = {"cpu": "600m", "memory": "1536Mi"}


def _delete(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None = None) -> None:
    try:
        if namespace:
            custom.delete_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, plural, name)
        else:
            custom.delete_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _gone(custom: client.CustomObjectsApi, plural: str, name: str, namespace: str | None = None) -> bool:
    try:
        if namespace:
            custom.get_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, plural, name)
        else:
            custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@pytest.fixture(scope="module")
def queue(kube: ApiClient, stack_info: StackInfo, namespace: str) -> Iterator[str]:
    """Kueue installed, and a LocalQueue in the namespace on a ClusterQueue with quota for one run."""
    kueue.install(stack_info, kube)
    custom = client.CustomObjectsApi(kube)
    flavor, cluster_queue = f"flavor-{namespace}", f"cq-{namespace}"
    objects: list[tuple[str, str, str | None, dict[str, Any]]] = [
        ("resourceflavors", flavor, None, {}),
        (
            "clusterqueues",
            cluster_queue,
            None,
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [{"name": k, "nominalQuota": v} for k, v in ONE_RUN.items()],
                            }
                        ],
                    }
                ],
            },
        ),
        ("localqueues", QUEUE, namespace, {"clusterQueue": cluster_queue}),
    ]
    try:
        for plural, name, ns, spec in objects:
            kind = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue"}.get(plural, "LocalQueue")
            body = {
                "apiVersion": f"{kueue.GROUP}/{kueue.VERSION}",
                "kind": kind,
                "metadata": {"name": name},
                "spec": spec,
            }
            if ns:
                custom.create_namespaced_custom_object(kueue.GROUP, kueue.VERSION, ns, plural, body)
            else:
                custom.create_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, body)
        yield QUEUE
    finally:
        # Queues go while Kueue runs (its finalizers on them), then Kueue with its CRDs and webhooks.
        for plural, name, ns, _ in reversed(objects):
            _delete(custom, plural, name, ns)
            wait_for(lambda p=plural, n=name, s=ns: _gone(custom, p, n, s), timeout=60, what=f"{plural}/{name} gone")
        kueue.uninstall(kube, stack_info.kubeconfig)


def test_two_runs_in_a_queue_with_quota_for_one_run_one_after_the_other(
    queue: str, kube: ApiClient, namespace: str, stack_info: StackInfo, unique: str, operator: OperatorProcess
) -> None:
    """Two Transforms in one queue: Kueue admits the first; the second's run stays suspended, its status
    saying it waits for admission in the queue and why (Kueue's words), past its submission deadline,
    and starts only once the first has finished."""
    transforms = Resources(kube, "transforms", namespace)
    produce(stack_info.kafka_bootstrap, f"{unique}-in", [{"id": i} for i in range(5)], key="id")
    spec = {
        "inputs": [{"name": "rows", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT"}}],
        "sql": "SELECT count(*) AS n FROM rows",
        "output": {"kafka": {"topic": f"{unique}-out"}},
        "queue": queue,
        "submissionDeadlineSeconds": 30,  # a queued run is not failed by it: the wait is Kueue's
    }
    first, second = f"{unique}-a", f"{unique}-b"
    # The first run holds the quota for 40 s and more (each of its 5 rows pauses 8 s in the executor), past the
    # second's 30 s deadline however fast the machine: the second waits that long in the queue. (Under
    # `length(...) >= 0` the pause is evaluated per row: `coalesce(...) IS NOT NULL` is optimized away.)
    pause = "reflect('java.lang.Thread', 'sleep', cast(id * 0 + 8000 AS BIGINT))"
    transforms.create(
        first, {**spec, "sql": f"SELECT count(*) AS n FROM rows WHERE length(coalesce({pause}, '')) >= 0"}
    )
    wait_for(
        lambda: (transforms.status(first).get("currentRun") or {}).get("applicationState") == "RUNNING" or None,
        timeout=180,
        what="the first run admitted and its driver running",
    )
    transforms.create(second, spec)

    def waiting() -> dict[str, Any] | None:
        # Kueue's words once it has tried to admit it (before that: no Workload yet, or no word).
        ready = transforms.condition(second)
        if ready.get("reason") == "WaitingForAdmission" and "insufficient unused quota" in ready["message"]:
            return ready
        return None

    said = wait_for(waiting, timeout=120, what="the second Transform waiting for admission, with Kueue's reason")
    print(f"{first} admitted first; {second}: {said['message']}")
    assert f"waiting for admission in queue {queue}: couldn't assign flavors" in said["message"]
    [app] = spark_apps(kube, namespace, second)
    assert app["spec"]["suspend"] is True and app["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    assert transforms.status(second)["currentRun"]["applicationState"] == "QUEUED"
    [workload] = [
        w
        for w in kueue.workloads(kube, namespace)
        if w["metadata"]["ownerReferences"][0]["name"] == app["metadata"]["name"]
    ]
    reserved = {c["type"]: c["status"] for c in workload["status"].get("conditions") or []}
    assert reserved.get("QuotaReserved") != "True"

    transforms.wait_condition(first, "True", "Succeeded", timeout=300)
    done = transforms.wait_condition(second, "True", "Succeeded", timeout=300)
    first_run, second_run = (transforms.status(n)["currentRun"] for n in (first, second))
    # Past its 30 s submission deadline in the queue, and not failed for it; its driver started only once
    # the first run had ended (Kueue's quota back).
    assert parse_time(second_run["startedAt"]) >= parse_time(first_run["finishedAt"]), (first_run, second_run)
    assert (parse_time(second_run["startedAt"]) - parse_time(second_run["submittedAt"])).total_seconds() > 30
    print(f"{second}: {done['message']} ({time.strftime('%H:%M:%S')})")
