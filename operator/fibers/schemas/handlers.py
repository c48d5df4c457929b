"""kopf handlers for Schema and SchemaRegistry: thin, they hand each resource to `SchemaOperator`.

Two kopf indexes give every handler the registries and every Schema's claim on its subject without
an API call: the Schema managing a subject on a registry owns it, else the oldest claiming it.
"""

from __future__ import annotations

from typing import Any

import kopf

from fibers.api import GROUP, VERSION
from fibers.outages import api_outage_is_temporary
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles
from fibers.schemas.operator import SchemaOperator
from fibers.schemas.settings import SchemaSettings
from fibers.schemas.spec import KIND, PLURAL, REGISTRIES, Claim, RegistrySpec, parse_registry


def _operator(memo: Any) -> SchemaOperator:
    found: SchemaOperator = memo.schemas
    return found


def _registries(kwargs: dict[str, Any]) -> list[RegistrySpec]:
    """The `schema_registries` index, which kopf passes as a keyword argument."""
    index: kopf.Index[str, RegistrySpec] = kwargs["schema_registries"]
    return [spec for name in index for spec in index[name]]


def _claims(kwargs: dict[str, Any], subject: str) -> list[Claim]:
    """The claims of every Schema on `subject`, from the `schema_claims` index."""
    index: kopf.Index[str, Claim] = kwargs["schema_claims"]
    return list(index.get(subject, []))


@kopf.index(GROUP, VERSION, REGISTRIES)
def schema_registries(name: str, spec: kopf.Spec, **_: Any) -> dict[str, RegistrySpec]:
    return {name: parse_registry(name, spec)}


@kopf.index(GROUP, VERSION, PLURAL)
def schema_claims(
    namespace: str | None, name: str, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, **_: Any
) -> dict[str, Claim]:
    created, subject = str(meta.get("creationTimestamp")), str(spec.get("subject"))
    managed = bool(status.get("managed")) and status.get("subject") == subject
    # "" (an empty Helm value) is the default registry, as parse_schema reads it: a claim kept as "" matched
    # no registry, and the subject it holds looked free to others.
    registry = spec.get("registry") or None
    return {
        subject: Claim(created, str(namespace), name, registry, str(status.get("registryUrl") or "") if managed else "")
    }


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def schema_changed(body: kopf.Body, spec: kopf.Spec, memo: kopf.Memo, **kwargs: Any) -> None:
    claims = _claims(kwargs, str(spec.get("subject")))
    with api_outage_is_temporary():
        await _operator(memo).reconcile_schema(dict(body), _registries(kwargs), claims)


@kopf.timer(GROUP, VERSION, PLURAL, interval=SchemaSettings.retry, initial_delay=SchemaSettings.retry)
async def schema_tick(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Drift, a registry that came back, a subject's owner that went away: looked at on a slow beat."""
    operator = _operator(memo)
    if operator.due(str(meta["uid"]), dict(status)):
        claims = _claims(kwargs, str(spec.get("subject")))
        with api_outage_is_temporary():
            await operator.reconcile_schema(dict(body), _registries(kwargs), claims)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def schema_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Any change, its registration in status too: Transforms whose Avro inputs name it look again."""
    readiness: Readiness = memo.readiness  # the pod is Ready once kopf has handed over what existed
    readiness.seen(PLURAL, body["metadata"]["namespace"], body["metadata"]["name"])
    reconciles: Reconciles = memo.reconciles
    reconciles.changed(KIND, body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def schema_deleted(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    await _operator(memo).delete_schema(dict(body), _registries(kwargs))


@kopf.on.event(GROUP, VERSION, REGISTRIES)
async def registry_event(event: kopf.RawEvent, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Watch events only: kopf's own handlers (and timers) would put a finalizer on a platform team's
    SchemaRegistry, which then outlives an uninstalled operator. `SchemaOperator.run` probes them."""
    readiness: Readiness = memo.readiness
    readiness.seen(REGISTRIES, None, name)
    _operator(memo).observe_registry(event.get("type"), name, dict(body))
