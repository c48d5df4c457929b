"""The Schema and SchemaRegistry reconcilers' shared state: one registry client per URL, the defaults,
and when each Schema is next due for a look. kopf's handlers (see `handlers`) call in here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from fibers import conditions, credentials
from fibers.api import object_ref
from fibers.conditions import READY, RECONCILING, Condition, format_time, utcnow
from fibers.kube import Kube, describe
from fibers.registries import KIND as REGISTRY_KIND
from fibers.schemas import plan, steps
from fibers.schemas.ccompat import RegistryClient, RegistryError, RegistryUnreachable
from fibers.schemas.settings import SchemaSettings
from fibers.schemas.spec import (
    KIND,
    PLURAL,
    REGISTRIES,
    Claim,
    RegistryNotChosen,
    RegistrySpec,
    choose_registry,
    needs_namespace,
    owner,
    parse_registry,
    parse_schema,
)
from fibers.schemas.steps import Outcome
from fibers.selectors import selector_matches
from fibers.wake import sleep_until_woken

log = logging.getLogger("fibers.schemas")

REGISTERING = "Registering"  # the reason while a new subject's first register call is made


class CredentialsUnavailable(Exception):
    """A Secret the SchemaRegistry names cannot be read, or is outside the credential namespaces."""


class SchemaOperator:
    def __init__(self, kube: Kube, settings: SchemaSettings, default_registry: str | None) -> None:
        self.kube = kube
        self.settings = settings
        self.default_registry = default_registry
        self._clients: dict[str, tuple[RegistrySpec, RegistryClient]] = {}  # registry name → client of that spec
        self._looked_at: dict[str, float] = {}  # uid → monotonic time of the last full reconcile
        self._registries: dict[str, dict[str, Any]] = {}  # name → the SchemaRegistry's body, from its watch
        self._due: dict[str, float] = {}  # name → monotonic time of its next probe
        self._wake = asyncio.Event()
        self._making = asyncio.Lock()

    async def client(self, registry: RegistrySpec) -> RegistryClient:
        """The registry's client, with its credentials read when it is first used or its spec changed.

        Raises CredentialsUnavailable when a Secret it names cannot be read (or may not be)."""
        async with self._making:  # one client per registry, even when a probe and a Schema ask at once
            return await self._client(registry)

    async def _client(self, registry: RegistrySpec) -> RegistryClient:
        kept = self._clients.get(registry.name)
        if kept is not None and kept[0] == registry:
            return kept[1]
        try:
            found = await credentials.resolve(registry.auth, self.kube, self.settings.secret_namespaces, REGISTRY_KIND)
        except Exception as exc:  # reported, and read again
            raise CredentialsUnavailable(f"{REGISTRY_KIND} {registry.name}: {credentials.problem(exc)}") from None
        if kept is not None:
            await kept[1].aclose()
        made = RegistryClient(registry.url, headers=found.headers, tls=found.tls, secrets=found.secrets)
        self._clients[registry.name] = (registry, made)
        return made

    async def secret_changed(self, namespace: str, secret: str) -> None:
        """A Secret changed (the operator's watch of Secrets): each registry naming it gets a new client,
        with the values read then, at its next use; its probe runs now and says whether they work."""
        for name, (registry, old) in list(self._clients.items()):
            if (namespace, secret) in credentials.named(registry.auth):
                async with self._making:
                    self._clients.pop(name, None)
                await old.aclose()  # calls are made under `client()`'s answer: a Schema retries a failed one
                log.info("SchemaRegistry credentials to be read again", extra={"registry": name})
                self._due[name] = 0.0
                self._wake.set()

    async def aclose(self) -> None:
        for _, c in self._clients.values():
            await c.aclose()

    # ----- Schema ----------------------------------------------------------------------------------

    def due(self, uid: str, status: dict[str, Any]) -> bool:
        """The timer looks every `retry` seconds while the registry does not answer (Reconciling); an in-sync
        or a stalled Schema (which waits for a change of its own) only every `resync` seconds."""
        since = time.monotonic() - self._looked_at.get(uid, 0.0)
        waiting = conditions.is_true(status.get("conditions"), RECONCILING)
        return since >= (self.settings.retry if waiting else self.settings.resync)

    async def reconcile_schema(
        self, body: dict[str, Any], registries: Iterable[RegistrySpec], claims: Iterable[Claim]
    ) -> None:
        meta, status = body["metadata"], dict(body.get("status") or {})
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        self._looked_at[uid] = time.monotonic()
        spec = parse_schema(body["spec"])
        if conditions.paused(meta):  # the registry is not called: its subject stays as it is
            kept = {k: v for k, v in status.items() if k not in ("conditions", "observedGeneration")}
            ready = conditions.find(status.get("conditions"), READY) or {}
            held = conditions.Condition(
                READY,
                ready.get("status") == "True",
                str(ready.get("reason") or "ReconciliationPaused"),
                str(ready.get("message") or ""),
            )
            await self._write(body, Outcome(status=kept, conditions=[held, conditions.PAUSED]))
            return
        # What the last look recorded (managed, versions) stands through a look that cannot act: written
        # without it, `managed` was lost and the subject then looked registered outside Fibers for good.
        kept = {k: v for k, v in status.items() if k not in ("conditions", "observedGeneration")}
        known = list(registries)
        labels = (namespace, await self.kube.namespace_labels(namespace)) if needs_namespace(known) else None
        try:
            registry = choose_registry(spec.registry, known, self.default_registry, labels)
        except RegistryNotChosen as exc:
            await self._write(body, Outcome(status=kept, conditions=conditions.waiting("RegistryNotFound", str(exc))))
            return
        by_name: dict[str | None, RegistrySpec] = {r.name: r for r in known}
        with contextlib.suppress(RegistryNotChosen):
            by_name[None] = choose_registry(None, known, self.default_registry)
        where = {name: r.url for name, r in by_name.items()}
        allowed = [c for c in claims if await self._may_use(c, by_name.get(c.registry) or registry, namespace)]
        holder = owner(allowed, registry.url, where)
        if holder is not None and (holder.namespace, holder.name) != (namespace, name):
            through = (
                f" (through SchemaRegistry {holder.registry}, the same registry)"
                if (holder.registry not in (None, registry.name))
                else ""
            )
            message = (
                f"subject {spec.subject!r} on SchemaRegistry {registry.name} belongs to Schema "
                f"{holder.namespace}/{holder.name}{through}; this resource changes nothing"
            )
            out = Outcome(status={"registry": registry.name, "subject": spec.subject})
            out.conditions = conditions.stalled("SubjectOwned", message)
            await self._write(body, out)
            return

        async def write_ahead(record: dict[str, Any]) -> None:
            """Before a new subject's first register call, through the status path of every look: the
            register is not made if this write fails."""
            waiting = conditions.waiting(REGISTERING, f"registering {spec.subject!r} on SchemaRegistry {registry.name}")
            await self._write(body, Outcome(status={**kept, plan.REGISTERING: record}, conditions=waiting))
            kept[plan.REGISTERING] = record  # and kept through a look that then fails

        try:
            out = await steps.reconcile(spec, registry, await self.client(registry), status, uid, write_ahead)
        except CredentialsUnavailable as exc:
            out = Outcome(status=kept)
            out.conditions = conditions.waiting(
                "RegistryCredentials", f"{exc}; tried again every {self.settings.retry:.0f} s"
            )
        except RegistryUnreachable as exc:
            out = Outcome(status=kept)
            out.conditions = conditions.waiting(
                "RegistryUnreachable", f"{exc}; tried again every {self.settings.retry:.0f} s"
            )
        except RegistryError as exc:
            out = Outcome(status=kept)
            out.conditions = conditions.waiting("RegistryError", f"the registry answered {exc}")
        await self._write(body, out)

    async def _may_use(self, claim: Claim, registry: RegistrySpec, namespace: str) -> bool:
        """Whether a claim's namespace may use the registry it names: a Schema in a namespace the registry's
        namespaceSelector leaves out is refused (RegistryNotFound), and its claim must not hold the subject
        against the namespaces it serves — or any namespace could pre-claim every subject name."""
        if claim.namespace == namespace or not registry.namespace_selector:
            return True
        labels = await self.kube.namespace_labels(claim.namespace)
        return selector_matches(dict(registry.namespace_selector), dict(labels))

    async def delete_schema(self, body: dict[str, Any], registries: Iterable[RegistrySpec]) -> None:
        """deletionPolicy Delete soft-deletes a subject this resource managed (or registered, the answer lost
        before a look confirmed it); Retain (the default) keeps it."""
        spec, status, uid = parse_schema(body["spec"]), dict(body.get("status") or {}), body["metadata"]["uid"]
        self._looked_at.pop(uid, None)
        if not spec.delete_subject:
            return
        managed = bool(status.get("managed") and status.get("subject") == spec.subject)
        # A first registration whose answer was lost, not yet confirmed by a look: confirmed here.
        held = status if managed else dict(status.get(plan.REGISTERING) or {})
        if not held:
            return
        by_name = {r.name: r for r in registries}
        registry = by_name.get(held.get("registry", ""))
        if registry is None:
            log.warning("SchemaRegistry %s is gone: subject %s kept", held.get("registry"), spec.subject)
            return
        if not plan.same_server(held, registry):  # what is at the new url was never this resource's
            log.warning(
                "SchemaRegistry %s now points to another server: subject %s kept on both",
                registry.name,
                spec.subject,
                extra={"managed_at": held.get("registryUrl")},
            )
            return
        client = await self.client(registry)  # unreachable: kopf retries
        if not managed:
            versions = await client.versions(spec.subject)
            if await steps.first_version(spec, registry, client, status, uid, versions) is None:
                return
        deleted = await client.delete_subject(spec.subject)
        log.info("subject soft-deleted", extra={"subject": spec.subject, "versions": deleted})

    async def _write(self, body: dict[str, Any], out: Outcome) -> None:
        meta, previous = body["metadata"], dict(body.get("status") or {})
        generation = int(meta.get("generation", 0))
        status = {**out.status, "observedGeneration": generation}
        status["conditions"] = conditions.merge(
            previous.get("conditions"), out.conditions, generation, format_time(utcnow())
        )
        ref = object_ref(KIND, meta["namespace"], meta["name"], meta["uid"])
        was = (conditions.find(previous.get("conditions"), READY) or {}).get("reason")
        for reason, message, warning in out.events:
            if not (warning and reason == was):  # a refusal is announced once, not on every look
                self.kube.post_event_soon(ref, reason, message, warning=warning)
        if status == previous:
            return
        await self.kube.replace_status(PLURAL, meta["namespace"], meta["name"], status, previous)
        body["status"] = status  # what a later write of this look patches
        before, after = conditions.find(previous.get("conditions"), READY) or {}, status["conditions"][0]
        if (before.get("status"), before.get("reason")) != (after["status"], after["reason"]):
            level = logging.INFO if after["status"] == "True" or after["reason"] == REGISTERING else logging.WARNING
            log.log(
                level,
                "Schema %s: %s",
                after["reason"],
                after["message"],
                extra={"namespace": meta["namespace"], "schema": meta["name"]},
            )

    # ----- SchemaRegistry --------------------------------------------------------------------------

    def observe_registry(self, event_type: str | None, name: str, body: dict[str, Any]) -> None:
        """Probe a SchemaRegistry now when it is new or its spec changed; forget a deleted one."""
        if event_type == "DELETED":
            known = self._registries.get(name)
            if known is not None and known["metadata"].get("uid") != body["metadata"].get("uid"):
                return  # the DELETED of an earlier registry of this name, handled after the new one's first event
            self._registries.pop(name, None)
            self._due.pop(name, None)
            return
        before = self._registries.get(name)
        self._registries[name] = body
        if before is None or before.get("spec") != body.get("spec"):
            self._due[name] = 0.0
            self._wake.set()

    async def run(self) -> None:
        """Probe each SchemaRegistry every `registry_probe` seconds (sooner after a change)."""
        while True:
            now = time.monotonic()
            for name in [n for n, due in self._due.items() if due <= now]:
                body = self._registries.get(name)
                self._due[name] = now + self.settings.registry_probe
                if body is not None:
                    try:
                        await self.probe_registry(parse_registry(name, body.get("spec") or {}), body)
                    except Exception as exc:  # one registry's trouble never stops the others' probes
                        log.warning("SchemaRegistry probe failed: %s", describe(exc), extra={"registry": name})
            self._wake.clear()
            wait = min((d - time.monotonic() for d in self._due.values()), default=self.settings.registry_probe)
            await sleep_until_woken(self._wake, max(0.5, wait))

    async def probe_registry(self, registry: RegistrySpec, body: dict[str, Any]) -> None:
        """Ready when the registry's API answers; how many subjects it serves."""
        previous, generation = dict(body.get("status") or {}), int(body["metadata"].get("generation", 0))
        status: dict[str, Any] = {"url": registry.url, "observedGeneration": generation}
        try:
            client = await self.client(registry)
            status["subjects"] = len(await client.subjects())
            status["compatibility"] = await client.global_compatibility()
            conds: list[Condition] = conditions.ready("Reachable", f"the registry answers at {registry.url}")
        except CredentialsUnavailable as exc:
            conds = conditions.waiting("CredentialsUnavailable", str(exc))
        except (RegistryUnreachable, RegistryError) as exc:
            conds = conditions.waiting("Unreachable", str(exc))
        status["conditions"] = conditions.merge(previous.get("conditions"), conds, generation, format_time(utcnow()))
        if status != previous:
            try:
                await self.kube.replace_cluster_status(REGISTRIES, registry.name, status, previous)
                self._registries.setdefault(registry.name, body)["status"] = status
            except Exception as exc:
                log.warning("cannot write SchemaRegistry status: %s", describe(exc), extra={"registry": registry.name})
