"""A SchemaRegistry's client takes its credentials from the Secrets it names, read again when one changes."""

from __future__ import annotations

import asyncio

from fibers.registries import parse_registry
from fibers.schemas.operator import SchemaOperator
from fibers.schemas.settings import SchemaSettings
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
