"""What the Schema steps decide without the registry's help (pure): whether this resource manages its
subject, why it may not take one over, and what of an earlier registration stays true."""

from __future__ import annotations

from typing import Any

from fibers.schemas.spec import RegistrySpec, SchemaSpec, same_registry


def managed(previous: dict[str, Any], subject: str, registry: RegistrySpec) -> bool:
    """This resource registered versions of this subject on this registry before (its status says so).
    The registry is the server, not the SchemaRegistry's name: once a SchemaRegistry's url points
    elsewhere, the subject there is one this resource never registered, and treating it as managed would
    register over, and with deletionPolicy Delete delete, what another team keeps on that server."""
    return (
        bool(previous.get("managed"))
        and previous.get("subject") == subject
        and previous.get("registry") == registry.name
        and same_server(previous, registry)
    )


def same_server(previous: dict[str, Any], registry: RegistrySpec) -> bool:
    """The server the status recorded (`registryUrl`) is the registry's now; a status written before the
    field existed recorded none, and its name stands for it."""
    recorded = previous.get("registryUrl")
    return recorded is None or recorded == same_registry(registry.url)


def moved(previous: dict[str, Any], registry: RegistrySpec) -> str | None:
    """The server this resource managed its subject on, when the registry's URL no longer leads there."""
    if previous.get("managed") and not same_server(previous, registry):
        return str(previous["registryUrl"])
    return None


def refusal(
    spec: SchemaSpec,
    registry: RegistrySpec,
    subject: str,
    versions: list[int],
    managed: bool,
    moved_from: str | None = None,
) -> tuple[str, str] | None:
    """(reason, message) when the subject has versions registered outside Fibers and may not be taken
    over; None when this resource may manage it."""
    if managed or not versions or (spec.adopt and registry.allow_adopt):
        return None
    if spec.adopt:  # a namespace user's word alone takes over no subject: the registry must allow it
        reason, why = "AdoptNotAllowed", f"SchemaRegistry {registry.name} does not allow adopting (spec.allowAdopt)"
    else:
        reason, why = "SubjectExists", "set spec.adopt: true to manage it"
    where = (
        f"registered outside Fibers (this resource managed the subject on {moved_from}, where SchemaRegistry "
        f"{registry.name} no longer points)"
        if moved_from
        else "registered outside Fibers"
    )
    return reason, f"subject {subject!r} already has versions {versions} {where}; it is left as it is ({why})"


def on_server(previous: dict[str, Any]) -> dict[str, Any]:
    """What the status says this resource manages on the server `registryUrl` names."""
    return {k: previous[k] for k in ("managed", "registryUrl", "registeredVersions") if k in previous}


def kept(previous: dict[str, Any]) -> dict[str, Any]:
    """What the last successful registration recorded: still true while a new schema is refused."""
    return {k: previous[k] for k in ("version", "id", "latestVersion") if k in previous}
