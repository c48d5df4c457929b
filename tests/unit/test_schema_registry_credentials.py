"""A SchemaRegistry's client takes its credentials from the Secrets it names, read again when one changes."""

from __future__ import annotations

import asyncio

from fibers.registries import parse_registry
from fibers.schemas.handlers import schema_claims
from fibers.schemas.operator import CredentialsUnavailable, SchemaOperator
from fibers.schemas.settings import SchemaSettings
from fibers.schemas.spec import Claim
from tests.unit.test_connect_registry import Secrets


def test_a_rotated_token_reaches_the_registrys_next_call_and_only_that_registrys() -> None:
    """Its client was made once per spec: a rotated token was never read again until the spec changed,
    and every call failed 401 in the meantime."""
    values = {("ops", "tok", "token"): "old"}
    spec = {
        "url": "http://r:8080/apis/ccompat/v7",
        "auth": {"bearer": {"secretRef": {"namespace": "ops", "name": "tok"}}},
    }

    async def scenario() -> tuple[str, str, bool]:
        operator = SchemaOperator(Secrets(values), SchemaSettings(), default_registry=None)  # type: ignore[arg-type]
        registry, other = parse_registry("r", spec), parse_registry("o", {"url": "http://o:8080"})
        first, kept = await operator.client(registry), await operator.client(other)
        values["ops", "tok", "token"] = "new"
        await operator.secret_changed("ops", "elsewhere")
        assert await operator.client(registry) is first  # a Secret it does not name
        await operator.secret_changed("ops", "tok")
        second = await operator.client(registry)
        untouched = await operator.client(other) is kept
        headers = (first._http.headers["Authorization"], second._http.headers["Authorization"])
        await operator.aclose()
        return *headers, untouched

    before, after, untouched = asyncio.run(scenario())
    assert (before, after, untouched) == ("Bearer old", "Bearer new", True)


def test_a_token_an_http_client_would_quote_in_its_error_is_refused_without_it() -> None:
    """A token with a line break inside made the HTTP client refuse the header and quote it, escaped, in
    its error, which masking (of the raw token) did not catch: the token reached every Schema's status."""
    values = {("ops", "tok", "token"): "s3cr3t-part1\ns3cr3t-part2"}
    spec = {"url": "http://r:8080", "auth": {"bearer": {"secretRef": {"namespace": "ops", "name": "tok"}}}}

    async def scenario() -> str:
        operator = SchemaOperator(Secrets(values), SchemaSettings(), default_registry=None)  # type: ignore[arg-type]
        try:
            await operator.client(parse_registry("r", spec))
        except CredentialsUnavailable as exc:  # the operator's wrapping of CredentialsRefused
            return str(exc)
        finally:
            await operator.aclose()
        return "accepted"

    said = asyncio.run(scenario())
    assert "whitespace or control characters" in said and "s3cr3t" not in said


class Namespaces:
    """Stands in for fibers.kube.Kube's namespace label reads."""

    async def namespace_labels(self, namespace: str) -> dict[str, str]:
        return {"team": namespace}


def test_a_claim_from_a_namespace_the_registry_leaves_out_holds_no_subject() -> None:
    """A Schema in a namespace the registry's selector leaves out is refused, yet its claim held the subject
    name against the namespaces the registry serves: any namespace could pre-claim every subject."""
    registry = parse_registry("shared", {"url": "http://r:8080", "namespaceSelector": {"matchLabels": {"team": "a"}}})
    operator = SchemaOperator(Namespaces(), SchemaSettings(), default_registry=None)  # type: ignore[arg-type]
    intruder = Claim("2026-01-01T00:00:00Z", "intruder", "x", "shared")
    neighbour = Claim("2026-01-01T00:00:00Z", "a", "y", "shared")
    assert not asyncio.run(operator._may_use(intruder, registry, "a"))
    assert asyncio.run(operator._may_use(neighbour, registry, "b"))
    assert asyncio.run(operator._may_use(intruder, parse_registry("open", {"url": "http://r:8080"}), "a"))


def test_an_empty_registry_is_the_default_in_a_claim_too() -> None:
    """`registry: ""` (an empty Helm value) registers on the default registry; its claim said "", matched no
    registry, and another namespace's Schema could adopt the subject it held."""
    meta = {"creationTimestamp": "2026-01-01T00:00:00Z"}
    claims = schema_claims(namespace="a", name="x", spec={"subject": "s", "registry": ""}, meta=meta, status={})
    assert claims["s"].registry is None


def test_a_late_deleted_event_of_an_earlier_registry_does_not_stop_the_probes_of_the_new_one() -> None:
    """A SchemaRegistry deleted and created again under its name: the old one's DELETED, handled after the new
    one's first event (kopf handles each uid's events apart), must not forget the new one."""
    operator = SchemaOperator(Namespaces(), SchemaSettings(), default_registry=None)  # type: ignore[arg-type]
    spec = {"url": "http://registry:8081"}
    operator.observe_registry(None, "main", {"metadata": {"name": "main", "uid": "u1"}, "spec": spec})
    operator.observe_registry("ADDED", "main", {"metadata": {"name": "main", "uid": "u2"}, "spec": spec})
    operator.observe_registry("DELETED", "main", {"metadata": {"name": "main", "uid": "u1"}, "spec": spec})
    assert operator._registries["main"]["metadata"]["uid"] == "u2" and "main" in operator._due
    operator.observe_registry("DELETED", "main", {"metadata": {"name": "main", "uid": "u2"}, "spec": spec})
    assert "main" not in operator._registries and "main" not in operator._due
