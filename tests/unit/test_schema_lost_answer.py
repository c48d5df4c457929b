"""A Schema's first registration whose answer is lost (a read timeout, a proxy's 502, a registry that
fails after its write or lags behind it): the registry stored the version, the Schema never heard so.

Its status then did not say `managed`, and the next look found the subject with a version "registered
outside Fibers": Stalled (SubjectExists) for good, and with deletionPolicy Delete the subject outlived the
resource. The write-ahead `status.registering`, written before the register call, lets the next look (or
the deletion) tell this resource's own version from someone else's.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from fibers import conditions
from fibers.kube import merge_patch
from fibers.registries import parse_registry
from fibers.schemas.ccompat import Compatibility, Registered, RegistryError, RegistryUnreachable
from fibers.schemas.operator import SchemaOperator
from fibers.schemas.settings import SchemaSettings

REGISTRY = parse_registry("main", {"url": "http://registry:8080/apis/ccompat/v7"})
SUBJECT = "orders-value"
ORDER = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}'
OTHER = '{"type": "record", "name": "Order", "fields": [{"name": "sku", "type": "string"}]}'


class Registry:
    """Stands in for RegistryClient: one server's subjects, each a list of live (version, id, payload).

    `after_write`: raised by the next register once it has stored the version (its answer lost);
    `lag`: the lookup right after a register does not find it yet; `config_error`: raised by the next
    set_compatibility."""

    def __init__(self) -> None:
        self.subjects: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
        self.numbered: dict[str, int] = {}  # subject → its last version number (soft-deleted ones count)
        self.levels: dict[str, str] = {}
        self.ids = 40
        self.after_write: Exception | None = None
        self.lag = False
        self.missing = False  # the next lookup does not find what is there (set by a register while `lag`)
        self.config_error: Exception | None = None
        self.registers = 0
        self.deleted: list[str] = []

    def store(self, subject: str, payload: dict[str, Any]) -> int:
        self.ids += 1
        self.numbered[subject] = self.numbered.get(subject, 0) + 1
        self.subjects.setdefault(subject, []).append((self.numbered[subject], self.ids, payload))
        return self.ids

    async def versions(self, subject: str) -> list[int]:
        return [v for v, _, _ in self.subjects.get(subject, [])]

    def find(self, subject: str, payload: dict[str, Any]) -> Registered | None:
        found = [(v, i) for v, i, p in self.subjects.get(subject, []) if p == payload]
        return Registered(subject, *found[0]) if found else None

    async def lookup(self, subject: str, payload: dict[str, Any]) -> Registered | None:
        missing, self.missing = self.missing, False
        return None if missing else self.find(subject, payload)

    async def check(self, subject: str, payload: dict[str, Any]) -> Compatibility:
        return Compatibility(True)

    async def register(self, subject: str, payload: dict[str, Any]) -> int:
        self.registers += 1
        found = self.find(subject, payload)
        schema_id = found.id if found else self.store(subject, payload)
        self.missing, self.lag = self.lag, False
        lost, self.after_write = self.after_write, None
        if lost is not None:
            raise lost
        return schema_id

    async def compatibility(self, subject: str) -> str | None:
        return self.levels.get(subject)

    async def set_compatibility(self, subject: str, level: str) -> None:
        failed, self.config_error = self.config_error, None
        if failed is not None:
            raise failed
        self.levels[subject] = level

    async def global_compatibility(self) -> str:
        return "BACKWARD"

    async def version(self, subject: str, version: int | str = "latest") -> Registered:
        v, i, _ = self.subjects[subject][-1]
        return Registered(subject, v, i)

    async def delete_subject(self, subject: str) -> list[int]:
        self.deleted.append(subject)
        return [v for v, _, _ in self.subjects.pop(subject, [])]


def _merged(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    new = dict(old)
    for key, value in patch.items():
        if value is None:
            new.pop(key, None)
        elif isinstance(value, dict) and isinstance(new.get(key), dict):
            new[key] = _merged(new[key], value)
        else:
            new[key] = value
    return new


class Kube:
    """Stands in for fibers.kube.Kube: keeps the Schema's status as the API server would merge its patches."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.writes = 0
        self.failing: Exception | None = None  # what the next status write raises

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], previous: dict[str, Any]
    ) -> None:
        failed, self.failing = self.failing, None
        if failed is not None:
            raise failed
        self.writes += 1
        self.status = _merged(self.status, merge_patch(previous or {}, status))

    def post_event_soon(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        pass

    async def namespace_labels(self, namespace: str) -> dict[str, str]:
        return {}


class Schema:
    """One Schema resource, its operator, and the registry it registers on."""

    def __init__(self, schema: str = ORDER, *, uid: str = "u1", **spec: Any) -> None:
        self.kube, self.registry = Kube(), Registry()
        self.operator = SchemaOperator(self.kube, SchemaSettings(), default_registry=None)  # type: ignore[arg-type]
        self.operator._clients[REGISTRY.name] = (REGISTRY, self.registry)  # type: ignore[assignment]
        self.uid, self.spec = uid, {"subject": SUBJECT, "registry": "main", "schema": schema, **spec}

    def body(self) -> dict[str, Any]:
        meta = {"namespace": "shop", "name": "orders", "uid": self.uid, "generation": 1}
        return {"metadata": meta, "spec": dict(self.spec), "status": copy.deepcopy(self.kube.status)}

    def look(self) -> tuple[str, str]:
        """One reconcile; the Ready condition's reason and message."""
        asyncio.run(self.operator.reconcile_schema(self.body(), [REGISTRY], []))
        ready = conditions.find(self.kube.status.get("conditions"), conditions.READY) or {}
        return str(ready.get("reason")), str(ready.get("message"))

    def delete(self) -> None:
        asyncio.run(self.operator.delete_schema(self.body(), [REGISTRY]))


LOST = {
    "read timeout": {"after_write": RegistryUnreachable("schema registry at http://registry:8080: ReadTimeout")},
    "proxy 502": {"after_write": RegistryUnreachable("answered HTTP 502 without an error of its own")},
    "registry 500 after its write": {"after_write": RegistryError(500, 50002, "Register operation timed out")},
    "registry lagging its write": {"lag": True},
    "compatibility not set": {"config_error": RegistryUnreachable("schema registry at http://registry:8080: reset")},
}


@pytest.mark.parametrize("lost", list(LOST.values()), ids=list(LOST))
def test_a_first_registration_whose_answer_was_lost_stays_this_schemas(lost: dict[str, Any]) -> None:
    schema = Schema(compatibility="FULL")
    vars(schema.registry).update(lost)
    assert schema.look()[0] in ("RegistryUnreachable", "RegistryError")
    assert schema.registry.subjects[SUBJECT][0][0] == 1  # stored, though the Schema never heard so
    reason, message = schema.look()
    status = schema.kube.status
    assert (reason, status.get("managed"), status.get("registeredVersions")) == ("Registered", True, [1]), message
    assert "registering" not in status  # a confirmed first registration leaves no record behind
    assert schema.registry.levels[SUBJECT] == "FULL" and schema.registry.registers == 1
    assert schema.look()[0] == "Registered"


def test_deleting_a_schema_whose_first_answer_was_lost_deletes_the_subject_it_registered() -> None:
    """deletionPolicy Delete, deleted before a look confirmed the registration: the subject was orphaned."""
    schema = Schema(deletionPolicy="Delete")
    schema.registry.after_write = RegistryUnreachable("ReadTimeout")
    schema.look()
    schema.delete()
    assert schema.registry.deleted == [SUBJECT] and SUBJECT not in schema.registry.subjects


def test_no_register_happens_without_its_write_ahead_status() -> None:
    """Written after the register, the record would be lost with the answer it stands in for."""
    schema = Schema()
    schema.kube.failing = RuntimeError("the API server does not answer")
    with pytest.raises(RuntimeError):
        schema.look()
    assert schema.registry.registers == 0 and SUBJECT not in schema.registry.subjects
    assert schema.look()[0] == "Registered" and schema.kube.status["managed"] is True


def test_a_subject_someone_else_registered_in_the_meantime_is_still_refused() -> None:
    schema = Schema(deletionPolicy="Delete")
    schema.registry.after_write = RegistryUnreachable("ReadTimeout")
    schema.look()
    schema.registry.store(SUBJECT, {"schema": OTHER, "schemaType": "AVRO"})  # another team's version 2
    reason, message = schema.look()
    assert reason == "SubjectExists" and "versions [1, 2]" in message and not schema.kube.status.get("managed")
    schema.delete()
    assert schema.registry.deleted == []


def test_a_schema_created_again_under_its_name_inherits_no_first_registration() -> None:
    """Another uid: a status carried over (a backup restored with its status) is not this resource's."""
    first = Schema()
    first.registry.after_write = RegistryUnreachable("ReadTimeout")
    first.look()
    assert "registering" in first.kube.status
    first.uid = "u2"
    assert first.look()[0] == "SubjectExists"


def test_a_spec_changed_before_the_next_look_is_refused_until_it_is_put_back() -> None:
    """The record holds the digest of the payload it was about to register, not the payload: a version of
    another schema cannot be told from someone else's, and is refused; the record stays until then."""
    schema = Schema()
    schema.registry.after_write = RegistryUnreachable("ReadTimeout")
    schema.look()
    schema.spec["schema"] = OTHER
    reason, message = schema.look()
    assert reason == "SubjectExists" and "registering" in schema.kube.status
    assert "first registration of an earlier spec.schema" in message and "outside Fibers" not in message
    schema.spec["schema"] = ORDER
    assert schema.look()[0] == "Registered" and schema.kube.status["registeredVersions"] == [1]
