"""Which Connect resource owns a connector, as Kafka Connect itself records it (pure: no I/O).

A connector Fibers creates carries its owner in its own config: `fibers.owner: <namespace>/<name>`.
Kafka Connect passes unknown keys to the connector, which ignores them, and lists them back with the
config, so every listing that reads configs also says whose each connector is. A namespace user can
write neither: the key is refused in `spec.config` and `spec.secretConfig` (the CRD's CEL and
`spec.parse`), and Kafka Connect is beyond their reach. The `fibers.dev/owned-connector` annotation
on the resource only mirrors the claim (it is written ahead of the create, so a crash between the two
is recognised); it never makes another's connector ours.

Two resources, in one namespace or in two, that name the same connector on one Kafka Connect are thus
told apart: the one whose name the connector carries acts on it, the other reports ConnectorNotOwned
naming the owner's namespace, and neither a create that finds the name taken nor a deletion touches a
connector that carries another owner.

A connector without the key was created by hand, or by a Fibers from before this record. The second
kind is taken over (the key is then written) by the resource that carries our claim annotation and
wants exactly the config the connector has: what an upgrade meets, and nothing a forged annotation can
use without also knowing the connector's whole config, secrets included.
"""

from __future__ import annotations

OWNER_KEY = "fibers.owner"  # in a connector's config: `<namespace>/<name>` of the Connect that created it
NO_OWNER = ""  # `owner_of`'s answer for a connector without the key that is not taken over


def owner_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def owner_of(config: dict[str, str], *, us: str, claimed: bool, desired: dict[str, str]) -> str:
    """Whose the connector with this config is: its owner key; else ours when it is ours to take over
    (see the module's docstring), else NO_OWNER.

    `us`: our owner id; `claimed`: the resource carries our claim annotation; `desired`: the config we
    would give the connector (the owner key included)."""
    if OWNER_KEY in config:
        return config[OWNER_KEY]
    if claimed and config == without_owner(desired):
        return us
    return NO_OWNER


def without_owner(config: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in config.items() if k != OWNER_KEY}


def described(owner: str) -> str:
    """The owner, as a condition names it."""
    if owner == NO_OWNER:
        return f"a connector Fibers did not create (its config has no {OWNER_KEY})"
    namespace, _, name = owner.partition("/")
    return f"the connector of Connect {name} in namespace {namespace}"
