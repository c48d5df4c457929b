"""A consumer's Secrets and its pods (fibers.databus.secrets): a changed value replaces the pods, nothing else does."""

from __future__ import annotations

from typing import Any

from fibers.databus import secrets

SPEC = {
    "sinks": [
        {"type": "mongodb", "uriSecretRef": {"name": "view", "key": "uri"}},
        {"type": "kafka", "topic": "feed"},
        {"type": "mongodb", "uriSecretRef": {"name": "view", "key": "uri"}},
    ],
    "bootstrap": {"enabled": True, "uriSecretRef": {"name": "store", "key": "uri"}},
}


def sts(recorded: str | None = None, template: str | None = None) -> dict[str, Any]:
    def notes(value: str | None) -> dict[str, Any]:
        return {"annotations": {secrets.HASH: value}} if value else {}

    return {"metadata": notes(recorded), "spec": {"template": {"metadata": notes(template)}}}


def test_the_secret_keys_a_consumers_pods_take() -> None:
    assert secrets.referenced(SPEC) == [("store", "uri"), ("view", "uri")]
    assert secrets.referenced({"sink": {"type": "log"}}) == []


def test_a_digest_moves_with_a_value_and_never_holds_it() -> None:
    one = secrets.digest({("view", "uri"): ("uid-1", "mongodb://a:s3cret@db/")})
    assert one == secrets.digest({("view", "uri"): ("uid-1", "mongodb://a:s3cret@db/")}) and "s3cret" not in one
    assert one != secrets.digest({("view", "uri"): ("uid-1", "mongodb://a:other@db/")})
    assert secrets.digest({("view", "uri"): None}) != secrets.digest({("view", "uri"): ("uid-1", "")})  # gone ≠ empty


def test_a_digest_cannot_be_reproduced_without_the_secrets_uid() -> None:
    """It sits on the StatefulSet, which namespace readers see: with the Secret's name and key from the spec,
    a guessed password could be checked against it offline. Keyed by the Secret's uid, it cannot."""
    value = "mongodb://a:s3cret@db/"
    assert secrets.digest({("view", "uri"): ("uid-1", value)}) != secrets.digest({("view", "uri"): ("uid-2", value)})


def test_only_a_changed_digest_replaces_the_pods_and_a_first_one_does_not() -> None:
    assert secrets.digests(None, "d1") == ("d1", None, False)  # created with its digest
    assert secrets.digests(sts(), "d1") == ("d1", None, False)  # a StatefulSet from before: recorded only
    assert secrets.digests(sts("d1"), "d1") == ("d1", None, False)  # a watch event, values unchanged
    assert secrets.digests(sts("d1"), None) == ("d1", None, False)  # not read: nothing known to move
    assert secrets.digests(sts("d1"), "d2") == ("d2", "d2", True)  # rotated: the template takes it
    assert secrets.digests(sts("d2", "d2"), None) == ("d2", "d2", False)  # kept on the next looks
