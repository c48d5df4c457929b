"""Reading Schema resources, and who owns a subject (pure: no I/O). SchemaRegistries: `fibers.registries`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fibers.registries import PLURAL as REGISTRIES
from fibers.registries import (
    RegistryNotChosen,
    RegistrySpec,
    choose_registry,
    needs_namespace,
    parse_registry,
    same_registry,
)

__all__ = [
    "REGISTRIES",
    "Claim",
    "RegistryNotChosen",
    "RegistrySpec",
    "SchemaSpec",
    "choose_registry",
    "needs_namespace",
    "owner",
    "parse_registry",
    "parse_schema",
    "same_registry",
]

PLURAL = "schemas"
KIND = "Schema"

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


@dataclass(frozen=True)
class Reference:
    """Another subject's version that this schema refers to by name (a named Avro type, an import)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class SchemaSpec:
    registry: str | None  # a SchemaRegistry name; None: the default one
    subject: str
    schema_type: str
    schema: str
    compatibility: str | None  # the subject's level; None: leave the registry's as it is
    references: tuple[Reference, ...]
    delete_subject: bool  # deletionPolicy Delete: soft-delete the subject with the resource
    adopt: bool  # take over a subject that already has versions registered outside Fibers

    def payload(self) -> dict[str, Any]:
        """The body of the Confluent API's register, lookup and compatibility calls."""
        body: dict[str, Any] = {"schema": self.schema, "schemaType": self.schema_type}
        if self.references:
            body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version} for r in self.references]
        return body


def parse_schema(spec: Mapping[str, Any]) -> SchemaSpec:
    """The CRD has validated the shape; this only gives it types and defaults."""
    return SchemaSpec(
        registry=spec.get("registry") or None,
        subject=spec["subject"],
        schema_type=spec.get("schemaType", "AVRO"),
        schema=spec["schema"],
        compatibility=spec.get("compatibility") or None,
        references=tuple(Reference(r["name"], r["subject"], int(r["version"])) for r in spec.get("references") or []),
        delete_subject=spec.get("deletionPolicy", "Retain") == "Delete",
        adopt=bool(spec.get("adopt", False)),
    )


@dataclass(frozen=True, order=True)
class Claim:
    """A Schema resource's hold on a subject: the one managing it owns it, else the oldest; others are refused."""

    created: str  # metadata.creationTimestamp (RFC 3339, so it sorts as text)
    namespace: str
    name: str
    registry: str | None  # as the resource says it (None: the default)
    managed_at: str = ""  # the server its status says it manages the subject on (status.registryUrl), if any


def owner(claims: Iterable[Claim], location: str, where: Mapping[str | None, str]) -> Claim | None:
    """The oldest claim on the subject among those whose registry is at `location` (`where`: each registry
    name, and None for the default, to its URL). Compared by URL, not name: two SchemaRegistries a platform
    declares for one registry (one per team, say) are one set of subjects, and a Schema through the second
    must not take over, change or delete a subject a Schema through the first holds.

    A claim managing the subject on that server comes first: an older claim that did not count when the
    subject was registered (its SchemaRegistry not declared yet, its namespace outside the selector) and
    counts now must not take over, change or delete the subject the other registered."""
    here = same_registry(location)
    same = [c for c in claims if c.registry in where and same_registry(where[c.registry]) == here]
    managing = [c for c in same if c.managed_at and same_registry(c.managed_at) == here]
    return min(managing or same, default=None)
