"""What the Schema steps decide without the registry's help (pure): whether this resource manages its
subject, why it may not take one over, and what of an earlier registration stays true."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fibers.registries import leads_to
from fibers.schemas.spec import RegistrySpec, SchemaSpec, same_registry

REGISTERING = "registering"  # status: the first registration of a new subject, under way (see `registering`)


def managed(previous: dict[str, Any], subject: str, registry: RegistrySpec) -> bool:
    """This resource registered versions of this subject on this registry's server before (its status says
    so). The server, not the SchemaRegistry's name: once a SchemaRegistry's url leads elsewhere, the subject
    there is one this resource never registered, and taking it for managed would register over, and with
    deletionPolicy Delete delete, what another team keeps on that server. (A status written before
    `registryUrl` was recorded names only its SchemaRegistry, which stands for the server.)"""
    if not (previous.get("managed") and previous.get("subject") == subject):
        return False
    if "registryUrl" in previous:
        return same_server(previous, registry)
    return bool(previous.get("registry") == registry.name)


def registering(uid: str, spec: SchemaSpec, registry: RegistrySpec) -> dict[str, Any]:
    """The write-ahead record of a new subject's first registration, written to status before its register
    call: should the registry store the version and its answer be lost (a read timeout, a proxy's 5xx, an
    error after its write), the status never says `managed`, and the next look would take the subject for
    one registered outside Fibers, for good. It names this resource (its uid: a Schema created again under
    the name is another), the server, the subject and a digest of the very payload, what `first_version`
    (steps) looks for; and the SchemaRegistry a deletion reaches the server through."""
    payload = json.dumps(spec.payload(), sort_keys=True, separators=(",", ":"))
    return {
        "uid": uid,
        "registry": registry.name,
        "registryUrl": same_registry(registry.url),
        "subject": spec.subject,
        "digest": hashlib.sha256(payload.encode()).hexdigest(),
    }


def _recorded(previous: dict[str, Any], registry: RegistrySpec) -> dict[str, Any] | None:
    """The status's write-ahead record, under whatever name the SchemaRegistry has now (as for `managed`)."""
    record = previous.get(REGISTERING)
    return {**record, "registry": registry.name} if isinstance(record, dict) else None


def was_registering(previous: dict[str, Any], uid: str, spec: SchemaSpec, registry: RegistrySpec) -> bool:
    """The status records this resource's first registration of spec.schema as the subject on this server.
    A spec.schema changed since is not recognised: its digest is another, and the version the registration
    left may be someone else's."""
    return _recorded(previous, registry) == registering(uid, spec, registry)


def registered_another(previous: dict[str, Any], uid: str, spec: SchemaSpec, registry: RegistrySpec) -> bool:
    """The status records this resource's first registration of the subject on this server, of a schema
    other than spec.schema (changed since its answer was lost): what it left cannot be told from another's."""
    record = _recorded(previous, registry)
    if record is None:  # the common case, on every look: no payload digest made
        return False
    ours = registering(uid, spec, registry)
    return record.get("digest") != ours["digest"] and {**record, "digest": ours["digest"]} == ours


def same_server(previous: dict[str, Any], registry: RegistrySpec) -> bool:
    """The server the status recorded is the registry's now (or the status recorded none)."""
    return leads_to(registry, previous.get("registryUrl"))


def moved(previous: dict[str, Any], subject: str, registry: RegistrySpec) -> str | None:
    """The server this resource managed this subject on, when the registry's url no longer leads there."""
    if previous.get("managed") and previous.get("subject") == subject and not same_server(previous, registry):
        return str(previous["registryUrl"])
    return None


def same_store(previous: dict[str, Any], versions: list[int], found: tuple[int, int]) -> bool:
    """A registry reached at a new url holds what this resource registered at the old one: every version it
    registered, and spec.schema (`found`: its version and id as the new url answers them, matched by
    content) as the version it recorded under the same global id. The same store under another name (a
    Service's full name, https, another API path), where the subject is still this resource's; a server
    that merely has a subject of the name has neither the content nor, but by chance, the ids. (A spec
    changed along with the url is not recognised: the subject is then refused until adopted.)"""
    own = [int(v) for v in previous.get("registeredVersions") or []]
    return bool(own) and set(own) <= set(versions) and found == (previous.get("version"), previous.get("id"))


def refusal(
    spec: SchemaSpec,
    registry: RegistrySpec,
    subject: str,
    versions: list[int],
    managed: bool,
    moved_from: str | None = None,
    registered_another: bool = False,
) -> tuple[str, str] | None:
    """(reason, message) when the subject has versions registered outside Fibers and may not be taken
    over; None when this resource may manage it. `registered_another`: they may be what this resource's
    own first registration of an earlier spec.schema left (`registered_another` above)."""
    if managed or not versions or (spec.adopt and registry.allow_adopt):
        return None
    if spec.adopt:  # a namespace user's word alone takes over no subject: the registry must allow it
        reason, why = "AdoptNotAllowed", f"SchemaRegistry {registry.name} does not allow adopting (spec.allowAdopt)"
    else:
        reason, why = "SubjectExists", "set spec.adopt: true to manage it"
    if moved_from:
        where = (
            f"registered outside Fibers (this resource managed the subject on {moved_from}, where SchemaRegistry "
            f"{registry.name} no longer points)"
        )
    elif registered_another:
        where = (
            "that this resource's first registration of an earlier spec.schema may have left (its answer was "
            "lost, and spec.schema changed since: they cannot be told from someone else's)"
        )
        if reason == "SubjectExists":
            why = "put spec.schema back as it was to take them, or set spec.adopt: true"
    else:
        where = "registered outside Fibers"
    return reason, f"subject {subject!r} already has versions {versions} {where}; it is left as it is ({why})"


def on_server(previous: dict[str, Any]) -> dict[str, Any]:
    """What the status says this resource manages on the server `registryUrl` names."""
    return {k: previous[k] for k in ("managed", "registryUrl", "registeredVersions") if k in previous}


def kept(previous: dict[str, Any]) -> dict[str, Any]:
    """What the last successful registration recorded: still true while a new schema is refused."""
    return {k: previous[k] for k in ("version", "id", "latestVersion") if k in previous}
