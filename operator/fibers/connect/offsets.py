"""Connector offsets on request (Kafka Connect's offsets API, KIP-875): pure, no I/O.

A user asks with the annotation `fibers.dev/offsets` on a Connect resource:

- `list`: the current offsets are written to the ConfigMap `<resource>-offsets` (key `offsets.json`),
  named in `status.offsets.configMap` with the time they were read;
- `reset`: every offset is forgotten, so the connector starts again from the beginning;
- `alter`: the offsets in a ConfigMap (`fibers.dev/offsets-from`, by default the list ConfigMap, in
  the form `list` writes) are applied.

Kafka Connect changes offsets of a STOPPED connector only: the connector is stopped, changed, and
returned to its desired state. The annotation stays until the operation has ended, so an operator
restart half-way carries on; it is then removed and the result lands in status. A Connect with
`spec.offsets.onCreate: reset` writes the `reset` annotation itself, together with its claim on the
connector name, and creates the connector STOPPED: it never runs on offsets a namesake left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fibers.api import ANNOTATION_OFFSETS, ANNOTATION_OFFSETS_FROM

OPERATIONS = ("list", "reset", "alter")
CONFIGMAP_KEY = "offsets.json"


class OffsetsInputError(ValueError):
    """The request or the offsets given cannot be applied; the message says what to fix."""


@dataclass(frozen=True)
class OffsetsRequest:
    operation: str  # list | reset | alter
    configmap: str = ""  # alter: where the offsets come from

    @property
    def needs_stop(self) -> bool:
        return self.operation in ("reset", "alter")


def configmap_name(resource: str) -> str:
    return f"{resource}-offsets"


def request_from(annotations: dict[str, str], resource: str) -> OffsetsRequest | None:
    """The operation the annotations ask for; an unknown one raises, naming the annotation."""
    value = (annotations.get(ANNOTATION_OFFSETS) or "").strip()
    if not value:
        return None
    if value not in OPERATIONS:
        raise OffsetsInputError(
            f"annotation {ANNOTATION_OFFSETS}={value!r} is not one of {', '.join(OPERATIONS)}; nothing was done"
        )
    source = annotations.get(ANNOTATION_OFFSETS_FROM) or configmap_name(resource)
    return OffsetsRequest(value, source if value == "alter" else "")


def render(offsets: dict[str, Any]) -> str:
    """Offsets as the ConfigMap holds them: Connect's own JSON, stable and readable for editing."""
    return json.dumps({"offsets": offsets.get("offsets") or []}, indent=2, sort_keys=True) + "\n"


def parse(text: str | None, where: str) -> dict[str, Any]:
    """Offsets to apply, checked before the connector is stopped: Connect's form, with at least one."""
    if text is None:
        raise OffsetsInputError(f"{where} has no key {CONFIGMAP_KEY}")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise OffsetsInputError(f"{where}: {CONFIGMAP_KEY} is not valid JSON ({exc})") from None
    entries = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(entries, list) or not entries:
        raise OffsetsInputError(f'{where}: {CONFIGMAP_KEY} must be {{"offsets": [{{"partition": …, "offset": …}}, …]}}')
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("partition"), dict) or "offset" not in entry:
            raise OffsetsInputError(f"{where}: offsets[{i}] needs a partition object and an offset (null resets it)")
    return {"offsets": entries}
