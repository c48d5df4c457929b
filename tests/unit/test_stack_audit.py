"""Reading the API server's audit log: a client's requests by user agent and time (no servers)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from fibers_stack import audit


def entry(at: str, agent: str, verb: str, resource: str, subresource: str | None = None) -> str:
    ref = {"resource": resource, "namespace": "shop", **({"subresource": subresource} if subresource else {})}
    return json.dumps(
        {
            "kind": "Event",
            "stage": "ResponseComplete",
            "requestReceivedTimestamp": at,
            "user": {"username": "admin"},
            "userAgent": agent,
            "verb": verb,
            "objectRef": ref,
        }
    )


def test_the_operators_requests_in_a_window_are_counted_by_verb_and_resource(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    rotated = tmp_path / "audit-2026-11-24T17-00-00.000.log"  # what --audit-log-maxsize leaves behind
    rotated.write_text(entry("2026-11-24T17:00:00.100000Z", "kopf/1.38", "watch", "databusconsumers") + "\n")
    log.write_text(
        "\n".join(
            [
                entry("2026-11-24T17:00:01.000000Z", "kopf/1.38", "patch", "databusconsumers", "status"),
                entry("2026-11-24T17:00:02.000000Z", "fibers", "list", "pods"),
                entry("2026-11-24T17:00:02.500000Z", "kube-controller-manager/v1.35.4", "list", "pods"),
                entry("2026-11-24T17:00:09.000000Z", "fibers", "get", "configmaps"),  # after the window
            ]
        )
        + "\n"
    )
    since, until = datetime(2026, 11, 24, 17, 0, 0, tzinfo=UTC), datetime(2026, 11, 24, 17, 0, 5, tzinfo=UTC)
    found = audit.requests(log, since, until)
    assert dict(audit.by_call(found)) == {
        "watch databusconsumers": 1,
        "patch databusconsumers/status": 1,
        "list pods": 1,
    }
    assert {r.agent for r in found} == {"kopf/1.38", "fibers"}


def test_a_namespace_filter_leaves_out_another_operators_namespaces_but_keeps_cluster_requests(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    lines = [
        entry("2026-11-24T17:00:01.000000Z", "fibers", "get", "transforms"),  # in "shop"
        entry("2026-11-24T17:00:01.500000Z", "fibers", "get", "transforms").replace('"shop"', '"other"'),
        entry("2026-11-24T17:00:02.000000Z", "kopf/1.38", "watch", "namespaces").replace(', "namespace": "shop"', ""),
    ]
    log.write_text("\n".join(lines) + "\n")
    since, until = datetime(2026, 11, 24, 17, 0, 0, tzinfo=UTC), datetime(2026, 11, 24, 17, 0, 5, tzinfo=UTC)
    found = audit.requests(log, since, until, namespaces=("shop", ""))
    assert sorted((r.namespace, r.verb) for r in found) == [("", "watch"), ("shop", "get")]
