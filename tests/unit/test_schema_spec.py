"""Schema and SchemaRegistry: reading the resources, choosing the registry, and who owns a subject."""

from __future__ import annotations

from typing import Any

import pytest

from fibers.credentials import HttpAuth, SecretKey
from fibers.schemas import plan
from fibers.schemas.handlers import schema_claims
from fibers.schemas.spec import (
    Claim,
    RegistryNotChosen,
    RegistrySpec,
    choose_registry,
    needs_namespace,
    owner,
    parse_registry,
    parse_schema,
    same_registry,
)

A = RegistrySpec("a", "http://a/apis/ccompat/v7", default=False)
B = RegistrySpec("b", "http://b", default=True)


def test_parse_schema_defaults_and_payload() -> None:
    spec = parse_schema({"subject": "orders-value", "schema": '{"type": "string"}'})
    assert (spec.registry, spec.schema_type, spec.compatibility, spec.delete_subject, spec.adopt) == (
        None,
        "AVRO",
        None,
        False,
        False,
    )
    assert spec.payload() == {"schema": '{"type": "string"}', "schemaType": "AVRO"}


def test_payload_carries_references() -> None:
    spec = parse_schema(
        {
            "subject": "s",
            "schema": "x",
            "schemaType": "PROTOBUF",
            "deletionPolicy": "Delete",
            "references": [{"name": "common.proto", "subject": "common", "version": 2}],
        }
    )
    assert spec.delete_subject
    assert spec.payload()["references"] == [{"name": "common.proto", "subject": "common", "version": 2}]


def test_registry_named_by_the_schema_wins() -> None:
    assert choose_registry("a", [A, B], "b") == A


def test_operator_default_before_the_marked_one() -> None:
    assert choose_registry(None, [A, B], "a") == A
    assert choose_registry(None, [A, B], None) == B


@pytest.mark.parametrize(
    ("requested", "registries", "default", "words"),
    [
        ("c", [A, B], None, "'c' (spec.registry) does not exist"),
        (None, [A], None, "no SchemaRegistry is marked default"),
        (None, [A, B, RegistrySpec("c", "http://c", True)], None, "several SchemaRegistries are marked default"),
        (None, [A], "gone", "default SchemaRegistry 'gone' does not exist"),
    ],
)
def test_no_registry_says_why(
    requested: str | None, registries: list[RegistrySpec], default: str | None, words: str
) -> None:
    with pytest.raises(RegistryNotChosen, match=words.replace("(", r"\(").replace(")", r"\)")):
        choose_registry(requested, registries, default)


def test_oldest_claim_on_the_same_registry_owns_the_subject() -> None:
    first = Claim("2026-01-01T00:00:00Z", "team-a", "orders", "b")
    later = Claim("2026-02-01T00:00:00Z", "team-b", "orders", None)  # the default: b
    elsewhere = Claim("2025-01-01T00:00:00Z", "team-c", "orders", "a")  # same subject, another registry
    where = {"a": "http://a", "b": "http://b", None: "http://b"}
    assert owner([later, first, elsewhere], "http://b", where) == first
    assert owner([later, elsewhere], "http://b", where) == later
    assert owner([later], "http://a", where) is None


def test_two_schema_registries_declared_for_one_registry_share_its_subjects() -> None:
    """A platform declaring one registry twice (one SchemaRegistry per team, the second allowing adopt): a
    Schema through the second naming a subject a Schema through the first holds must not own it — with
    adopt it took the subject over, registered over it and, with deletionPolicy Delete, deleted it."""
    first = Claim("2026-01-01T00:00:00Z", "team-a", "orders", "team-a-registry")
    later = Claim("2026-02-01T00:00:00Z", "team-b", "orders", "team-b-registry")
    where = {"team-a-registry": "http://apicurio/apis/ccompat/v7", "team-b-registry": "http://apicurio/apis/ccompat/v7"}
    assert owner([later, first], "http://apicurio/apis/ccompat/v7", where) == first


def test_two_spellings_of_one_registry_url_share_its_subjects() -> None:
    """Declared once as `http://Apicurio:80/.../v7/` and once as `http://apicurio/.../v7`: compared as text,
    a Schema through the second took over a subject a Schema through the first held."""
    first = Claim("2026-01-01T00:00:00Z", "team-a", "orders", "team-a-registry")
    later = Claim("2026-02-01T00:00:00Z", "team-b", "orders", "team-b-registry")
    where = {
        "team-a-registry": "http://Apicurio:80/apis/ccompat/v7/",
        "team-b-registry": "http://apicurio/apis/ccompat/v7",
    }
    assert owner([later, first], "http://apicurio/apis/ccompat/v7", where) == first


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("HTTP://Registry.Example:80/apis/ccompat/v7/", "http://registry.example/apis/ccompat/v7", True),
        ("https://r.example:443/x", "https://r.example/x", True),
        ("https://user:pw@r.example/x", "https://r.example/x", True),  # and no password in the normal form
        ("http://r.example:8080/x", "http://r.example/x", False),
        ("https://r.example/x", "http://r.example/x", False),
        ("http://r.example/apis/ccompat/v6", "http://r.example/apis/ccompat/v7", False),
        ("http://[::1]:8080/x", "http://[::1]:8080/x/", True),
    ],
)
def test_a_registry_url_in_its_normal_form(one: str, other: str, same: bool) -> None:
    assert (same_registry(one) == same_registry(other)) is same
    assert "pw" not in same_registry(one)


def test_a_subject_is_managed_on_the_server_it_was_registered_on_not_under_a_registrys_name() -> None:
    status = {"managed": True, "subject": "orders", "registry": "shared", "registryUrl": "http://old/apis/ccompat/v7"}
    assert plan.managed(status, "orders", RegistrySpec("shared", "http://OLD:80/apis/ccompat/v7/", default=False))
    assert plan.managed(status, "orders", RegistrySpec("renamed", "http://old/apis/ccompat/v7", default=False))
    moved = RegistrySpec("shared", "http://new/apis/ccompat/v7", default=False)
    assert not plan.managed(status, "orders", moved)
    assert plan.moved(status, "orders", moved) == "http://old/apis/ccompat/v7"
    assert plan.moved(status, "payments", moved) is None  # what it managed there was another subject
    refused = plan.refusal(
        parse_schema({"subject": "orders", "schema": "{}"}), moved, "orders", [1], False, "http://old"
    )
    assert refused is not None and refused[0] == "SubjectExists" and "on http://old" in refused[1]
    # A status written before registryUrl was recorded: its registry's name stands for the server.
    legacy = {"managed": True, "subject": "orders", "registry": "shared"}
    assert plan.managed(legacy, "orders", moved) and plan.moved(legacy, "orders", moved) is None
    assert not plan.managed(legacy, "orders", RegistrySpec("other", "http://old/apis/ccompat/v7", default=False))


def test_a_new_url_of_the_same_store_is_recognised_by_what_the_schema_registered_there() -> None:
    status = {"managed": True, "subject": "orders", "version": 2, "id": 41, "registeredVersions": [1, 2]}
    assert plan.same_store(status, [1, 2, 3], (2, 41))
    assert not plan.same_store(status, [1, 2], (2, 7))  # spec.schema there, under another id: another server
    assert not plan.same_store(status, [2], (2, 41))  # a version it registered is not there
    assert not plan.same_store({**status, "registeredVersions": []}, [1, 2], (2, 41))


def test_a_first_registration_is_recognised_by_resource_server_subject_and_payload() -> None:
    spec = parse_schema({"subject": "orders", "schema": '"string"'})
    status = {plan.REGISTERING: plan.registering("u1", spec, A)}
    assert plan.was_registering(status, "u1", spec, RegistrySpec("renamed", "http://A:80/apis/ccompat/v7/", False))
    assert not plan.was_registering(status, "u2", spec, A)  # a Schema created again under the name
    assert not plan.was_registering(status, "u1", spec, RegistrySpec("a", "http://elsewhere", False))
    assert not plan.was_registering(status, "u1", parse_schema({"subject": "orders", "schema": '"long"'}), A)
    assert not plan.was_registering(status, "u1", parse_schema({"subject": "other", "schema": '"string"'}), A)
    assert not plan.was_registering({}, "u1", spec, A)


def test_a_registry_with_a_namespace_selector_refuses_other_namespaces() -> None:
    team_a_only = parse_registry("shared", {"url": "http://r", "namespaceSelector": {"matchLabels": {"team": "a"}}})
    assert choose_registry("shared", [team_a_only], None, ("orders", {"team": "a"})) == team_a_only
    with pytest.raises(RegistryNotChosen, match="SchemaRegistry shared does not allow namespace intruder"):
        choose_registry("shared", [team_a_only], None, ("intruder", {"team": "b"}))
    assert needs_namespace([A, team_a_only]) and not needs_namespace([A, B])


def test_adoption_is_the_registrys_to_allow() -> None:
    assert not parse_registry("r", {"url": "http://r"}).allow_adopt
    assert parse_registry("r", {"url": "http://r", "allowAdopt": True}).allow_adopt


def test_a_registry_names_its_credentials_as_a_connect_cluster_does() -> None:
    spec = {
        "url": "https://r/apis/ccompat/v7",
        "auth": {"basic": {"secretRef": {"namespace": "fibers-system", "name": "registry"}}},
        "tls": {"caSecretRef": {"namespace": "fibers-system", "name": "registry-ca", "key": "ca.pem"}},
    }
    auth = parse_registry("r", spec).auth
    assert auth.basic_user == SecretKey("fibers-system", "registry", "username")
    assert auth.basic_password == SecretKey("fibers-system", "registry", "password")
    assert auth.ca == SecretKey("fibers-system", "registry-ca", "ca.pem") and auth.bearer_token is None
    assert parse_registry("r", {"url": "http://r"}).auth == HttpAuth()


def test_a_claim_managing_the_subject_keeps_it_when_an_older_one_comes_to_count() -> None:
    """team-b's Schema is older, but did not count when team-a's registered the subject (its SchemaRegistry
    was declared later, or its namespace let in later). Ranked by age alone it then owned the subject: team-a
    lost it, and with adopt allowed team-b registered over it and, with deletionPolicy Delete, deleted it."""
    older = Claim("2026-01-01T00:00:00Z", "team-b", "orders", "team-b-registry")
    registered = Claim("2026-02-01T00:00:00Z", "team-a", "orders", "team-a-registry", "http://apicurio/apis/ccompat/v7")
    where = {
        "team-a-registry": "http://apicurio/apis/ccompat/v7",
        "team-b-registry": "http://Apicurio:80/apis/ccompat/v7/",
    }
    assert owner([older, registered], "http://apicurio/apis/ccompat/v7", where) == registered
    moved = Claim("2026-02-01T00:00:00Z", "team-a", "orders", "team-a-registry", "http://old-registry/apis/ccompat/v7")
    assert owner([older, moved], "http://apicurio/apis/ccompat/v7", where) == older  # managed elsewhere: no hold here


def test_a_claim_carries_the_server_its_status_says_it_manages_the_subject_on() -> None:
    meta = {"creationTimestamp": "2026-02-01T00:00:00Z"}
    url = "http://apicurio/apis/ccompat/v7"

    def claim(status: dict[str, Any]) -> Claim:
        spec = {"subject": "orders-value", "registry": "team-a-registry"}
        found = schema_claims(namespace="team-a", name="orders", spec=spec, meta=meta, status=status)  # type: ignore[arg-type]
        return found["orders-value"]

    assert claim({"managed": True, "subject": "orders-value", "registryUrl": url}).managed_at == url
    assert claim({"managed": True, "subject": "orders-key", "registryUrl": url}).managed_at == ""  # another subject
    assert claim({}).managed_at == ""
