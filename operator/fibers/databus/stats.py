"""The figures consumer instances record on their checkpoint ConfigMap, read back into status (pure).

Consumer pods write them (`fibers.dev/stats-<instance>`), and a consumer pod runs the namespace
user's own callback under a ServiceAccount that may update that ConfigMap: they are read as untrusted
input. Each is bounded in size, read as JSON or skipped, its numbers taken as numbers or as 0, and
only the spec's own sink names are kept (they become status entries and Prometheus label values, so
a pod cannot grow the operator's memory or series). What is skipped is returned, to be said once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from fibers.databus.timelines import STATS_ANNOTATION

# The most characters one instance's figures may take: a few sinks' figures are ~300; more is not ours.
STATS_MAX_CHARS = 8192
TEXT_MAX_CHARS = 64  # a time stamp, as RFC 3339 writes it, is 32


def instance_stats(annotations: Mapping[str, str], instances: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The figures of each current instance (one scaled away is left out), and what was skipped and why."""
    stats, skipped = [], []
    for key, value in sorted(annotations.items()):
        ordinal = key.removeprefix(STATS_ANNOTATION)
        if not (key.startswith(STATS_ANNOTATION) and ordinal.isdigit() and int(ordinal) < instances):
            continue
        if len(value) > STATS_MAX_CHARS:
            skipped.append(f"{key}: over {STATS_MAX_CHARS} characters")
            continue
        try:
            parsed = json.loads(value)
        except ValueError:
            skipped.append(f"{key}: not JSON")
            continue
        if not isinstance(parsed, dict):
            skipped.append(f"{key}: not a JSON object")
            continue
        stats.append(parsed)
    return stats, skipped


def _count(value: Any) -> int:
    """A count as the pods should write it; anything else (text, negative, a float's junk) is 0."""
    try:
        number = int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0
    return max(number, 0)


def _seconds(value: Any) -> float:
    try:
        number = float(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return number if 0 <= number < float("inf") else 0.0


def _entries(value: Any) -> list[dict[str, Any]]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def sink_figures(stats: list[dict[str, Any]], sinks: Collection[str]) -> list[dict[str, Any]]:
    """Each of the spec's sinks' figures summed over the instances (the slowest last batch), in spec order."""
    counts = {name: dict.fromkeys(("windows", "errors", "timeouts"), 0) for name in sinks}
    slowest: dict[str, float] = {}  # the sinks some instance reported, with their slowest last batch
    for instance in stats:
        for own in _entries(instance.get("sinks")):
            name = str(own.get("name"))
            if name not in counts:
                continue  # not a sink of the spec
            for key in counts[name]:
                counts[name][key] += _count(own.get(key))
            slowest[name] = max(slowest.get(name, 0.0), _seconds(own.get("lastBatchSeconds")))
    return [{"name": name, **counts[name], "lastBatchSeconds": slowest[name]} for name in sinks if name in slowest]


def mirror(status: dict[str, Any], stats: list[dict[str, Any]], sinks: Collection[str]) -> None:
    """The instances' figures into the consumer's status: lag and events summed, the latest checkpoint
    time, each sink's figures, and records passed as undecodable."""
    if not stats:
        return
    status["lag"] = sum(_count(s.get("lag")) for s in stats)
    status["eventsProcessed"] = sum(_count(s.get("eventsProcessed")) for s in stats)
    status["lastCheckpointTime"] = max(str(s.get("lastCheckpointTime", ""))[:TEXT_MAX_CHARS] for s in stats)
    if figures := sink_figures(stats, sinks):
        status["sinks"] = figures
    passed: list[dict[str, Any]] = [u if isinstance(u := s.get("undecodable"), dict) else {} for s in stats]
    undecodable = {k: sum(_count(p.get(k)) for p in passed) for k in ("skipped", "deadLettered")}
    if any(undecodable.values()):
        status["undecodable"] = undecodable
