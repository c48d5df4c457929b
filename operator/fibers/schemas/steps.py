"""Bringing one subject in line with its Schema resource, in explicit, ordered steps.

1. ownership: a subject with versions that Fibers did not register is left alone (unless spec.adopt); a
   version this resource's own first registration left, its answer lost, is told apart by the record
   written to status before the register call (`plan.registering`);
2. compatibility: the subject's level is set first, so it governs the check that follows;
3. lookup: is this schema already a version of the subject?
4. check, then register: a new schema is tested against the subject's level; an incompatible one is
   refused with the registry's messages and nothing is registered; a compatible one becomes the next version;
5. observe: every version of the subject, and drift (a latest version this resource did not register).

Each step may end the reconcile with a condition that says why; the registry is never changed by a
step that comes after a refusal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fibers.conditions import Condition, ready, stalled
from fibers.schemas import plan
from fibers.schemas.ccompat import INVALID_SCHEMA, Registered, RegistryClient, RegistryError
from fibers.schemas.spec import RegistrySpec, SchemaSpec, same_registry


@dataclass
class Outcome:
    """What one reconcile found: the status fields, the conditions, and the Events worth posting."""

    status: dict[str, Any] = field(default_factory=dict)
    conditions: list[Condition] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)  # (reason, message, warning)


# Writes a record (`plan.registering`) to status before a new subject's first register call; raises when
# it cannot, and then nothing is registered.
WriteAhead = Callable[[dict[str, Any]], Awaitable[None]]


async def reconcile(
    spec: SchemaSpec,
    registry: RegistrySpec,
    client: RegistryClient,
    previous: dict[str, Any],
    uid: str,
    write_ahead: WriteAhead,
) -> Outcome:
    """One pass over the steps; RegistryUnreachable propagates (the caller retries)."""
    subject = spec.subject
    out = Outcome(status={"registry": registry.name, "subject": subject})
    own: list[int] = [int(v) for v in previous.get("registeredVersions") or []]
    managed = plan.managed(previous, subject, registry)

    # 1. ownership
    versions = await client.versions(subject)
    first = None if managed else await first_version(spec, registry, client, previous, uid, versions)
    if first is not None:  # registered by this resource, the answer lost: the subject is its own
        managed, own = True, [first.version]
        out.events.append(("Registered", f"subject {subject}: version {first.version} (id {first.id})", False))
    moved_from = plan.moved(previous, subject, registry)
    same = await client.lookup(subject, spec.payload()) if moved_from else None
    if same and plan.same_store(previous, versions, (same.version, same.id)):  # a new url, the same store
        managed, moved_from = True, None
    another = plan.registered_another(previous, uid, spec, registry)
    refusal = plan.refusal(spec, registry, subject, versions, managed, moved_from, another)
    if refusal:
        out.conditions = stalled(*refusal)
        out.status["versions"] = versions
        if moved_from:  # still true of the server it names, should the registry's url be put back
            out.status.update(plan.on_server(previous))
        if plan.REGISTERING in previous:  # a registry that lags its own write may list it yet not find it
            out.status[plan.REGISTERING] = previous[plan.REGISTERING]
        return out
    if not managed:
        own = []  # a subject taken over (new, or adopted): nothing of it was registered by this resource
    out.status.update(managed=True, registryUrl=same_registry(registry.url))

    # 2. compatibility (a new subject gets its level right after its first version: Apicurio keeps no
    #    subject rule before the subject exists, and the first version has nothing to be compatible with)
    if versions:
        await _set_compatibility(spec, client, out)

    # 3. lookup
    payload = spec.payload()
    found = await client.lookup(subject, payload)

    # 4. check, then register
    if found is None:
        if versions:
            verdict = await client.check(subject, payload)
            if not verdict.compatible:
                why = "; ".join(verdict.messages) or "the registry gave no reason"
                level = out.status.get("compatibility", "NONE")
                out.conditions = stalled(
                    "Incompatible",
                    f"spec.schema is not {level}-compatible with version {versions[-1]} of "
                    f"{subject!r}; nothing was registered: {why}",
                )
                out.status.update(plan.kept(previous), versions=versions, registeredVersions=own)
                out.events.append(("Incompatible", out.conditions[0].message, True))
                return out
        if not (versions or managed):  # a new subject: recorded first, or a lost answer makes it a stranger's
            await write_ahead(plan.registering(uid, spec, registry))
        try:
            schema_id = await client.register(subject, payload)
        except RegistryError as exc:
            if exc.error_code == INVALID_SCHEMA or exc.status_code == 422:
                out.conditions = stalled("InvalidSchema", f"spec.schema: the registry refused it: {exc.message}")
                out.status.update(plan.kept(previous), versions=versions, registeredVersions=own)
                return out
            if exc.status_code == 409:  # the registry's own compatibility rule refused it
                out.conditions = stalled("Incompatible", f"spec.schema: the registry refused it: {exc.message}")
                out.status.update(plan.kept(previous), versions=versions, registeredVersions=own)
                return out
            raise
        found = await client.lookup(subject, payload)
        if found is None:  # registered but not found: a registry that lags its own writes
            raise RegistryError(500, 0, f"schema id {schema_id} was registered but {subject!r} does not list it yet")
        own = sorted({*own, found.version})
        out.events.append(("Registered", f"subject {subject}: version {found.version} (id {found.id})", False))
        if not versions:
            await _set_compatibility(spec, client, out)

    # 5. observe
    if "compatibility" not in out.status:
        out.status["compatibility"] = await _effective(subject, client)
    versions = await client.versions(subject)
    latest = await client.version(subject, "latest")
    out.status.update(
        version=found.version, id=found.id, versions=versions, registeredVersions=own, latestVersion=latest.version
    )
    if latest.id != found.id and latest.version not in own:
        out.conditions = stalled(
            "Drifted",
            f"the latest version of {subject!r} is {latest.version} (id {latest.id}), registered outside this "
            f"resource; spec.schema is version {found.version} (id {found.id})",
        )
        return out
    out.conditions = ready(
        "Registered", f"{subject} version {found.version} (id {found.id}), compatibility {out.status['compatibility']}"
    )
    return out


async def first_version(
    spec: SchemaSpec,
    registry: RegistrySpec,
    client: RegistryClient,
    previous: dict[str, Any],
    uid: str,
    versions: list[int],
) -> Registered | None:
    """The subject's one version, when it is what the first registration the status records
    (`plan.was_registering`) left: spec.schema, and no version besides. None when the subject holds a
    schema of someone else's too (registered before that register call or since): it is not taken over."""
    if not versions or not plan.was_registering(previous, uid, spec, registry):
        return None
    found = await client.lookup(spec.subject, spec.payload())
    return found if found is not None and versions == [found.version] else None


async def _set_compatibility(spec: SchemaSpec, client: RegistryClient, out: Outcome) -> None:
    """Give the subject spec.compatibility if it has another level; record the level in force."""
    level = await client.compatibility(spec.subject)
    if spec.compatibility and level != spec.compatibility:
        await client.set_compatibility(spec.subject, spec.compatibility)
        out.events.append(("CompatibilitySet", f"subject {spec.subject}: compatibility {spec.compatibility}", False))
        level = spec.compatibility
    out.status["compatibility"] = level if level and level != "NONE" else await client.global_compatibility()


async def _effective(subject: str, client: RegistryClient) -> str:
    level = await client.compatibility(subject)
    return level if level and level != "NONE" else await client.global_compatibility()
