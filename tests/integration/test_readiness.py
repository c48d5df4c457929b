"""The operator pod's Ready (`/readyz`, the chart's readiness probe): a real operator process against the
real API server, with one child watch's first listing held up by a failpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from kubernetes import client
from kubernetes.client import ApiClient

from fibers_stack import StackInfo, namespaces
from tests.helpers import Resources, wait_for
from tests.integration.conftest import OperatorProcess

NEVER = "0 0 1 1 *"
HELD_SECONDS = 10.0  # the first child-watch listing hangs this long


def test_the_operator_is_ready_only_once_its_watches_have_listed_what_exists(
    kube: ApiClient, stack_info: StackInfo, connect_cluster: str, tmp_path: Path, unique: str
) -> None:
    namespace = f"ready-{unique}"
    namespaces.create(kube, namespace)
    op = OperatorProcess(
        stack_info,
        namespace,
        tmp_path / "operator.log",
        {"FIBERS_CONNECT_DEFAULT_CLUSTER": connect_cluster, "FIBERS_FAILPOINTS": f"watch.list=1*hang({HELD_SECONDS})"},
    )
    try:
        # There before the operator starts: its Ready waits for kopf to hand this one over.
        Resources(kube, "transforms", namespace).create(
            unique,
            {
                "schedule": NEVER,
                "inputs": [{"name": "t", "kafka": {"topics": ["t"], "schema": "id INT"}}],
                "sql": "SELECT * FROM t",
                "output": {"files": {"path": "/data/out", "format": "json"}},
            },
        )
        op.start()
        answers: list[tuple[float, int, list[str]]] = []
        standby_answers: list[int] = []
        started = time.monotonic()

        def ready() -> bool:
            try:
                response = httpx.get(f"http://127.0.0.1:{op.metrics_port}/readyz", timeout=2)
            except httpx.TransportError:
                return False  # not serving yet
            body = json.loads(response.text)
            answers.append((time.monotonic() - started, response.status_code, body["waiting"]))
            assert body["ready"] == (response.status_code == 200)
            if response.status_code == 503 and any(r.startswith("the first listing of ") for r in body["waiting"]):
                # A standby's probe asks only whether it has started, so it could take over now.
                standby = httpx.get(f"http://127.0.0.1:{op.metrics_port}/readyz/standby", timeout=2)
                standby_answers.append(standby.status_code)
            return response.status_code == 200

        wait_for(ready, timeout=90, interval=0.2, what="the operator's /readyz to answer 200")
        waited = [reason for _, status, reasons in answers if status == 503 for reason in reasons]
        assert any(reason.startswith("the first listing of ") for reason in waited), answers
        assert answers[-1][0] >= HELD_SECONDS, f"Ready before the held listing was answered: {answers}"
        assert answers[-1][2] == []
        assert standby_answers and set(standby_answers) == {200}, standby_answers
        # Ready stays, and the operator did its work meanwhile: the Transform it handed over has a status.
        assert httpx.get(f"http://127.0.0.1:{op.metrics_port}/readyz", timeout=2).status_code == 200
        transforms = Resources(kube, "transforms", namespace)
        transforms.wait_condition(unique, "True", timeout=60)
        # /metrics is served beside it, as before.
        assert op.metric("fibers_reconciles_total", kind="Transform")
    finally:
        op.stop()
        client.CoreV1Api(kube).delete_namespace(namespace)
