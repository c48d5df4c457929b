"""Invalid and hostile specs through the real API server and a running operator.

For every kind, 300 specs generated from its CRD (tests/fuzz_specs.py: wrong types, values outside
enums, patterns and ranges, missing required fields, unknown fields, huge and unicode values), plus
the ones that pass a schema but cannot run (cron that never fires, names MongoDB refuses, …). Each is
sent as `kubectl apply` sends it (fieldValidation=Strict). Every one must be refused at admission with
a message, or be answered by the operator with Ready=False/InvalidSpec — and nothing may reach Kafka
Connect, Spark or MongoDB, and the operator must not raise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from pymongo import MongoClient

from fibers_stack import StackInfo
from tests.fuzz_specs import BASES, Case, cases, load_schema
from tests.helpers import wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.fuzz
CRDS = Path(__file__).resolve().parents[2] / "crds"
PER_KIND = 300
BATCH = {
    "inputs": [{"name": "orders", "kafka": {"topics": ["orders"]}}],
    "sql": "SELECT * FROM orders",
    "output": {"kafka": {"topic": "out"}},
}
MONGO_SINK = {"type": "mongodb", "uriSecretRef": {"name": "mongo", "key": "uri"}, "database": "fuzz"}

# Pass the CRD, cannot run: the operator must say InvalidSpec (name, spec, why).
SEMANTIC: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "transforms": [
        *[
            (f"fz-cron-{i}", {**BATCH, "schedule": cron}, f"cron {cron!r}")
            for i, cron in enumerate(
                ["61 * * * *", "* 24 * * *", "0 0 30 2 *", "*/0 * * * *", "0 0 * * 8", "0 0 0 * *"]
            )
        ],
        (
            "fz-views-case",
            {**BATCH, "inputs": [{"name": "a", "kafka": {"topics": ["x"]}}, {"name": "A", "kafka": {"topics": ["y"]}}]},
            "two views whose names differ only in case",
        ),
    ],
    "databusconsumers": [
        ("fz-coll-system", {"sources": ["t"], "sink": {**MONGO_SINK, "collection": "system.users"}}, "system.*"),
        ("fz-topic-dotdot", {"sources": [".."], "sink": {"type": "log"}}, "Kafka has no topic '..'"),
        ("fz-sink-topic-dot", {"sources": ["t"], "sink": {"type": "kafka", "topic": "."}}, "Kafka has no topic '.'"),
    ],
    "connects": [],
    "schemas": [],
}


def _create(custom: client.CustomObjectsApi, namespace: str, plural: str, kind: str, case: Case) -> str | None:
    """Create as kubectl would; the API server's refusal message, or None when it accepted the object."""
    body = {"apiVersion": "fibers.dev/v1beta1", "kind": kind, "metadata": {"name": case.name}, "spec": case.spec}
    try:
        custom.create_namespaced_custom_object(
            "fibers.dev", "v1beta1", namespace, plural, body, field_validation="Strict"
        )
    except ApiException as exc:
        assert exc.status in (400, 422), f"{case.name} ({case.why}): {exc.status} {exc.reason}"
        message = str(json.loads(exc.body or "{}").get("message") or "")
        assert message, f"{case.name} was refused without a message"
        return message
    return None


def _ready(custom: client.CustomObjectsApi, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
    body = custom.get_namespaced_custom_object("fibers.dev", "v1beta1", namespace, plural, name)
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)


@pytest.mark.parametrize("plural", list(BASES))
def test_every_invalid_spec_is_refused_or_answered_invalid_and_nothing_runs(
    plural: str,
    kube: ApiClient,
    namespace: str,
    operator: OperatorProcess,
    mongo_secret: str,
    stack_info: StackInfo,
    connect_http: httpx.Client,
) -> None:
    custom = client.CustomObjectsApi(kube)
    kind, bases = BASES[plural]
    generated = cases(kind, load_schema(CRDS / f"{plural}.fibers.dev.yaml"), bases, count=PER_KIND, seed=15)
    semantic = [Case(name, spec, "semantic", "spec", why) for name, spec, why in SEMANTIC[plural]]
    connectors_before = set(connect_http.get("/connectors").json())
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    databases_before = set(mongo.list_database_names())

    refused: dict[str, str] = {}
    accepted: list[Case] = []
    for case in [*generated, *semantic]:
        message = _create(custom, namespace, plural, kind, case)
        if message is None:
            accepted.append(case)
        else:
            refused[case.name] = message

    answered: dict[str, dict[str, Any]] = {}

    def all_answered() -> bool:
        for case in accepted:
            if case.name not in answered and (ready := _ready(custom, namespace, plural, case.name)):
                answered[case.name] = ready
        return len(answered) == len(accepted)

    wait_for(all_answered, timeout=120, what=f"a condition on each of {len(accepted)} accepted {plural}", interval=1)
    wrong = {
        case.name: (case.family, case.path, case.why, answered[case.name].get("reason"))
        for case in accepted
        if answered[case.name].get("reason") != "InvalidSpec" or answered[case.name].get("status") != "False"
    }
    assert not wrong, f"accepted but not InvalidSpec: {wrong}"
    assert all(s.name not in refused for s in semantic), "a semantic case is now refused at admission: move it"
    assert len(refused) + len(accepted) == PER_KIND + len(semantic)

    # Nothing ran for any of them.
    apps = client.AppsV1Api(kube).list_namespaced_stateful_set(namespace).items
    assert not apps, [d.metadata.name for d in apps]
    spark = custom.list_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", namespace, "sparkapplications")
    assert not spark["items"]
    assert set(connect_http.get("/connectors").json()) <= connectors_before
    assert set(mongo.list_database_names()) <= databases_before
    log = operator.log()
    assert "Traceback" not in log and "failed with an exception" not in log
    print(f"{plural}: {len(refused)} refused at admission, {len(accepted)} answered InvalidSpec")
