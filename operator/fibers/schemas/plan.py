"""What the Schema steps decide without the registry's help (pure): whether this resource manages its
subject, why it may not take one over, and what of an earlier registration stays true."""

from __future__ import annotations

from typing import Any

from fibers.schemas.spec import RegistrySpec, SchemaSpec


def managed(previous: dict[str, Any], subject: str, registry: str) -> bool:
    """This resource registered versions of this subject on this registry before (its status says so)."""
    return bool(previous.get("managed")) and previous.get("subject") == subject and previous.get("registry") == registry


def refusal(
    spec: SchemaSpec, registry: RegistrySpec, subject: str, versions: list[int], managed: bool
) -> tuple[str, str] | None:
    """(reason, message) when the subject has versions registered outside Fibers and may not be taken
    over; None when this resource may manage it."""
    if managed or not versions or (spec.adopt and registry.allow_adopt):
        return None
    if spec.adopt:  # a namespace user's word alone takes over no subject: the registry must allow it
        reason, why = "AdoptNotAllowed", f"SchemaRegistry {registry.name} does not allow adopting (spec.allowAdopt)"
    else:
        reason, why = "SubjectExists", "set spec.adopt: true to manage it"
    return reason, (
        f"subject {subject!r} already has versions {versions} registered outside Fibers; it is left as it is ({why})"
    )


def kept(previous: dict[str, Any]) -> dict[str, Any]:
    """What the last successful registration recorded: still true while a new schema is refused."""
    return {k: previous[k] for k in ("version", "id", "latestVersion") if k in previous}
