"""The index of which resources name which Secrets (fibers.secret_refs): names only, kept current."""

from __future__ import annotations

from fibers.secret_refs import SecretRefs
from fibers.watches import SECRETS, Child


def test_a_secrets_change_reaches_the_resources_naming_it_now_and_no_other() -> None:
    refs = SecretRefs()
    refs.note("Connect", "shop", "cdc", {"db", "registry"})
    refs.note("DatabusConsumer", "shop", "view", {"mongo", "db"})
    refs.note("Connect", "other", "cdc", {"db"})  # another namespace's Secret of the same name
    assert refs.referring("shop", "db") == [("Connect", "cdc"), ("DatabusConsumer", "view")]
    refs.note("Connect", "shop", "cdc", {"registry"})  # its spec no longer names db
    assert refs.referring("shop", "db") == [("DatabusConsumer", "view")]
    refs.forget("DatabusConsumer", "shop", "view")
    assert refs.referring("shop", "db") == [] and refs.referring("shop", "mongo") == []
    assert refs.referring("other", "db") == [("Connect", "cdc")]


def test_secrets_are_watched_by_name_and_metadata_only_children_by_their_owner_label() -> None:
    assert SECRETS.by_name and str(SECRETS) == "secrets.core (by name)"
    assert not Child("apps/v1", "statefulsets", "fibers.dev/databusconsumer").by_name
