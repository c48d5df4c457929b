"""When the operator pod is Ready: it has taken over what existed when it started, and it keeps up.

`helm upgrade --wait`, a rollout and a node drain go by the pod's Ready. A process that has started but
whose kopf watches have not listed yet is not serving anyone: a broken new version would read healthy
and the old pod would already be gone. So the pod answers `/readyz` with 200 only once

- the start-up handler has finished (clients made, loops started);
- every resource of the operator's kinds that existed at start-up has reached a kopf handler once
  (kopf lists before it watches, so one seen means its watch is running; one deleted in between is
  struck off when the kinds are listed again, `ReadinessPolicy.relist_seconds` later);
- every child watch (`fibers.watches`) has had its first listing answered;
- and, from then on, the reconcile queue keeps up: nothing handed to the workers has waited longer
  than `ReadinessPolicy.queue_lag_seconds`.

Otherwise 503, and the JSON body names what is waited for: `kubectl describe pod` shows it. A standby
answers `/readyz/standby`: Ready once its start-up has finished, so it can take over (its readiness probe
differs from its liveness probe, which is kopf's `/healthz`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("fibers.readiness")

Listing = Callable[[str], Awaitable[set[tuple[str, str]]]]  # plural -> (namespace, name) of each object
Gate = Callable[[], list[str]]  # what a part of the operator still waits for (empty: nothing)
NAMES_SHOWN = 3  # names of missing resources in one answer: enough to find them, short for `describe`


@dataclass(frozen=True)
class ReadinessPolicy:
    relist_seconds: float = 30.0  # resources listed at start-up and not seen since: listed again this often
    queue_lag_seconds: float = 120.0  # a reconcile waiting for a worker this long: the queue does not keep up


class Readiness:
    """The pod's Ready, from the event loop's facts; read by the metrics server's thread."""

    def __init__(self, policy: ReadinessPolicy | None = None) -> None:
        self.policy = policy or ReadinessPolicy()
        self._lock = threading.Lock()
        self._started = False
        self._stocked = False
        self._pending: dict[str, set[tuple[str, str]]] = {}  # plural -> objects listed at start, not seen yet
        self._seen: set[tuple[str, str, str]] = set()  # seen before the start-up listing ended
        self._gates: list[Gate] = []

    def gate(self, gate: Gate) -> None:
        """One more condition, checked at every probe."""
        with self._lock:
            self._gates.append(gate)

    def started(self) -> None:
        """The start-up handler has finished."""
        with self._lock:
            self._started = True

    def seen(self, plural: str, namespace: str | None, name: str) -> None:
        """A kopf handler got this object: its kind's watch is running."""
        key = (namespace or "", name)
        with self._lock:
            if self._stocked:
                if pending := self._pending.get(plural):
                    pending.discard(key)
            else:
                self._seen.add((plural, *key))

    async def take_stock(self, plurals: Iterable[str], listing: Listing) -> None:
        """What exists now, of each kind: each must be seen before the pod is Ready; then, while some are
        not, what was deleted before kopf listed it is struck off. A task of its own: an API server that
        does not answer is asked again, and the pod stays not Ready meanwhile."""
        plurals = list(plurals)
        while not self._stocked:
            try:
                stock = {plural: await listing(plural) for plural in plurals}
            except Exception as exc:  # any failure: the pod says it waits, and asks again
                log.warning("could not list what exists; retrying", extra={"error": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(self.policy.relist_seconds)
                continue
            with self._lock:
                for plural, objects in stock.items():
                    self._pending[plural] = {key for key in objects if (plural, *key) not in self._seen}
                self._seen.clear()
                self._stocked = True
        while missing := [plural for plural, pending in self._snapshot().items() if pending]:
            await asyncio.sleep(self.policy.relist_seconds)
            for plural in missing:
                try:
                    current = await listing(plural)
                except Exception:  # listed again at the next turn
                    continue
                with self._lock:
                    self._pending[plural] &= current

    def waiting(self) -> list[str]:
        """What the pod waits for before it is Ready; empty when it is."""
        with self._lock:
            if not self._started:
                return ["the start-up handler (API clients, Connect and reconcile loops)"]
            if not self._stocked:
                return ["the listing of what exists at start-up"]
            gates = list(self._gates)
        reasons = [
            f"{len(pending)} {plural} listed at start-up, not yet seen by their watch: "
            + ", ".join("/".join(p for p in key if p) for key in sorted(pending)[:NAMES_SHOWN])
            for plural, pending in sorted(self._snapshot().items())
            if pending
        ]
        for gate in gates:
            reasons.extend(gate())
        return reasons

    def waiting_to_take_over(self) -> list[str]:
        """What a standby (paused by kopf's peering) waits for before it is Ready: only its start-up, which kopf
        runs before it pauses the watches. A standby's watches never list while the active operator lives."""
        with self._lock:
            return [] if self._started else ["the start-up handler (API clients, Connect and reconcile loops)"]

    def _snapshot(self) -> dict[str, set[tuple[str, str]]]:
        with self._lock:
            return {plural: set(pending) for plural, pending in self._pending.items()}
