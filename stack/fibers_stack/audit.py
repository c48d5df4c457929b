"""The API server's audit log, read: how many requests a client made, counted by the server itself.

The stack's API server records every request but the node's (policy in `kube.AUDIT_POLICY`), one JSON
line each once answered. A client is told apart by its user agent: the operator's are kopf's
(`kopf/…`) and Fibers' own (`fibers`); the test and benchmark scripts, the controllers and `kubectl`
use the same admin identity with other agents.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

OPERATOR_AGENTS = ("kopf/", "fibers")


@dataclass(frozen=True)
class Request:
    at: datetime  # when the API server received it
    user: str
    agent: str
    verb: str  # get, list, watch, create, update, patch, delete, …
    resource: str  # plural, with subresource: "databusconsumers/status"; "" for a non-resource URL
    namespace: str


def _entries(path: Path) -> Iterator[dict[str, Any]]:
    """The log's entries, its rotated predecessor first (a long run can rotate it once)."""
    for file in [*sorted(path.parent.glob(path.stem + "-*" + path.suffix)), path]:
        if file.exists():
            with file.open() as lines:
                for line in lines:
                    if line.strip():
                        yield json.loads(line)


def requests(
    path: Path,
    since: datetime,
    until: datetime,
    agents: tuple[str, ...] = OPERATOR_AGENTS,
    namespaces: tuple[str, ...] | None = None,
) -> list[Request]:
    """The requests received in [since, until) from a client whose user agent starts with one of `agents`
    (and, given `namespaces`, about objects in one of them; "" is the cluster-scoped ones): another
    operator process running beside the one measured (a test's) has the same user agents."""
    found = []
    for entry in _entries(path):
        agent = str(entry.get("userAgent") or "")
        if not agent.startswith(agents):
            continue
        at = datetime.fromisoformat(str(entry["requestReceivedTimestamp"]).replace("Z", "+00:00"))
        if not since <= at < until:
            continue
        ref = entry.get("objectRef") or {}
        if namespaces is not None and str(ref.get("namespace") or "") not in namespaces:
            continue
        resource = str(ref.get("resource") or "")
        if ref.get("subresource"):
            resource += f"/{ref['subresource']}"
        user = entry.get("user") or {}
        assert isinstance(user, dict)
        found.append(
            Request(
                at,
                str(user.get("username") or ""),
                agent,
                str(entry.get("verb")),
                resource,
                str(ref.get("namespace") or ""),
            )
        )
    return found


def by_call(found: list[Request]) -> Counter[str]:
    """How many of each verb on each resource: "list pods", "get databusconsumers", …"""
    return Counter(f"{r.verb} {r.resource}" for r in found)
