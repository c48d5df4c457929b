"""One reconcile of one Connect resource against its connector as the cluster's listing shows it, as an
ordered list of named steps (`reconcile.decide`, in Strimzi's order): create (claimed first), verify the
config, move the state (an offsets operation first), restart; then report. The first step that fails
ends the list; `reconcile.report` says what came of it."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from fibers import conditions, metrics
from fibers.api import (
    ANNOTATION_CONNECT_CLUSTER,
    ANNOTATION_OFFSETS,
    ANNOTATION_OFFSETS_FROM,
    ANNOTATION_OWNED_CONNECTOR,
    ANNOTATION_RESTART,
    CONNECT_FINALIZER,
)
from fibers.conditions import READY, Condition, utcnow
from fibers.connect import groups, offsets, reconcile, validation
from fibers.connect.offset_steps import OffsetSteps
from fibers.connect.policy import ConnectPolicy
from fibers.connect.publisher import Publisher
from fibers.connect.reconcile import OFFSET_STEPS, Outcome, Step, Target
from fibers.connect.registry import ConnectClusters
from fibers.connect.rest import ConnectClient, ConnectError, ConnectorView, ConnectUnreachable
from fibers.connect.spec import PLURAL
from fibers.kube import Kube, additions, describe
from fibers.kubeapi import ApiError
from fibers.redact import redact

log = logging.getLogger("fibers.connect")


class InvalidConfig(Exception):
    """Kafka Connect's validation found errors: nothing is created or changed until the spec changes."""


class ClaimFailed(Exception):
    """The claim could not be written to the resource (e.g. no permission): nothing is created."""


class Steps:
    def __init__(
        self,
        kube: Kube,
        clusters: ConnectClusters,
        publisher: Publisher,
        policy: ConnectPolicy,
        acted_on: Callable[[Target], None],
        kafka_bootstrap: str | None = None,
    ) -> None:
        self.kube, self.clusters, self.publisher, self.policy = kube, clusters, publisher, policy
        self._acted_on = acted_on  # our patch of a resource: no new look at its spec (`Intake.acted_on`)
        self.offsets = OffsetSteps(kube, publisher, clusters, kafka_bootstrap or "")

    async def reconcile(
        self, client: ConnectClient, target: Target, listing: dict[str, ConnectorView], refresh_budget: list[int]
    ) -> bool:
        """Act on one resource; True when it needs no further attention now.

        The steps, in order (the first four are `reconcile.decide`'s, in Strimzi's order; the first that
        fails ends them):
        1. create the connector when Connect lists none (after our claim; Connect validates the config,
           and a refused one is named field by field);
        2. verify its config: the listing's against the spec's, written again when they differ;
        3. move its state (a reset or alter of its offsets stops it first, and holds the rest until done);
        4. restart it, on request or when it failed (auto-restart);
        5. report: its topics (while unknown, within the sync's budget), the status, and the request
           annotations done with.
        """
        assert target.spec is not None
        target.quiet_view = target.waiting_view = None  # until this reconcile ends with nothing to do
        observed = listing.get(target.spec.connector)
        target.observe_owner(observed)
        if target.owned and (CONNECT_FINALIZER not in target.finalizers or not target.claimed):
            await self._claim(target)  # ours, by Kafka Connect's record, but the resource lost its claim
        if observed is not None and observed.config is not None:
            target.config_verified = observed.config == target.config
        now = utcnow()
        steps = self._steps(target, observed, now)
        outcome = Outcome()
        if target.offsets_request and target.group_problem and target.group_problem.reason == groups.IN_USE:
            await self.offsets.refuse(target, outcome, target.group_problem.message)  # that group is another's
        for step in steps:
            try:
                await self._execute(client, target, step, outcome)
            except ConnectError as exc:
                outcome.failed, outcome.error = step, exc.message
                outcome.rejected = 400 <= exc.status_code < 500 and not exc.rebalancing and exc.status_code != 404
                break
            except ConnectUnreachable as exc:
                outcome.failed, outcome.error = step, str(exc)
                break
            except ClaimFailed as exc:
                outcome.failed, outcome.error, outcome.reason = step, str(exc), "ClaimFailed"
                break
            except InvalidConfig as exc:
                target.problem = Condition(READY, False, "InvalidConfig", str(exc))
                log.warning("config rejected by validation", extra={**target.context, "error": str(exc)})
                break
            outcome.done.append(step)
        if observed and target.owned and (steps or target.topics_due_now()) and refresh_budget[0] > 0:
            refresh_budget[0] -= 1
            outcome.topics = await self._topics(client, target)
        status = reconcile.report(target, observed, outcome, now)
        metrics.connector_state(target.namespace, target.name, status.get("connectorState"), status.get("runningTasks"))
        await self.publisher.publish(target, status)
        if outcome.offsets is not None and not outcome.seek_nonce:  # a seek is the spec's: no annotation to drop
            await self.kube.remove_annotation(
                PLURAL, target.namespace, target.name, ANNOTATION_OFFSETS, ANNOTATION_OFFSETS_FROM
            )
        if Step.RESTART in outcome.done and target.restart_requested:
            target.restart_requested = False
            await self.kube.remove_annotation(PLURAL, target.namespace, target.name, ANNOTATION_RESTART)
        settled = self._settled(target, observed, steps, status)
        if not settled and not steps and not target.problem:
            target.waiting_view = (observed, time.monotonic())
        return settled

    def _steps(self, target: Target, observed: ConnectorView | None, now: datetime) -> list[Step]:
        """`reconcile.decide`'s steps, but no create moments after ours: Connect lists a connector once
        its herder has caught up (`ConnectPolicy.create_settle`)."""
        steps = reconcile.decide(target, observed, now)
        if Step.CREATE in steps and time.monotonic() - target.created_at < self.policy.create_settle:
            return []
        return steps

    async def _topics(self, client: ConnectClient, target: Target) -> list[str] | None:
        """The connector's topics (None when Connect does not answer). An empty answer is asked again
        later, sooner at first, then less often up to a cap (`ConnectPolicy.topic_ask_base`, `topic_ask_max`)."""
        assert target.spec is not None
        target.topic_checks += 1
        target.topics_due = time.monotonic() + min(
            self.policy.topic_ask_base**target.topic_checks, self.policy.topic_ask_max
        )
        try:
            return await client.topics(target.spec.connector)
        except (ConnectError, ConnectUnreachable):
            return None

    def _settled(
        self, target: Target, observed: ConnectorView | None, steps: list[Step], status: dict[str, Any]
    ) -> bool:
        """Settled: nothing was done and nothing is in flight. A connector waiting out its restart
        backoff is settled too; the normal interval is precise enough for that. A new connector's
        topics are learnt at the fast pace for its first few asks (`ConnectPolicy.topic_fast_asks`), so
        the quiet interval does not spend its calls on them; a connector that writes nothing does not
        hold the fast pace."""
        reconciling = conditions.find(status["conditions"], conditions.RECONCILING) or {}
        learning_topics = (
            observed is not None
            and target.owned
            and not status.get("topics")
            and target.topic_checks < self.policy.topic_fast_asks
        )
        settled = (
            not steps
            and not learning_topics
            and (reconciling.get("status") != "True" or reconciling.get("reason") == "AutoRestarting")
        )
        if settled and not target.problem:
            target.quiet_view = observed
        return settled

    def _check_class(self, target: Target) -> None:
        """A class the cluster's plugin list (from its probe) does not have is refused without a call."""
        assert target.spec is not None
        if unknown := validation.unknown_class(
            target.spec.connector_class, self.clusters.plugins(target.cluster), target.cluster
        ):
            raise InvalidConfig(unknown)

    async def _checked(self, client: ConnectClient, target: Target, change: Awaitable[None]) -> None:
        """A create or a config update, validated by Kafka Connect itself.

        Connect validates every config it is given and refuses an invalid one with a 400, changing
        nothing: validation before apply costs no call of its own. Only a refused config is sent to
        the validation endpoint, whose answer names each field (InvalidConfig); a wave of 100 creates
        spared 100 validation calls this way (bench/connect_scale.py).
        """
        try:
            await change
        except ConnectError as exc:
            if exc.status_code != 400:
                raise
            await self._validate(client, target)
            raise  # the validation found nothing to name: Connect's own message stands

    async def _validate(self, client: ConnectClient, target: Target) -> None:
        """Kafka Connect's validation of the spec's config (its class was checked before the change);
        errors raise InvalidConfig naming fields."""
        assert target.spec is not None
        spec = target.spec
        try:
            result = await client.validate(spec.connector_class, target.config)
        except ConnectError as exc:
            if exc.rebalancing or (exc.status_code >= 500 and "find any class" not in exc.message):
                raise
            if "find any class" in exc.message:  # Connect lists every plugin in full: say it shorter
                installed = await client.plugins()
                raise InvalidConfig(
                    validation.unknown_class(spec.connector_class, installed, target.cluster) or exc.message
                ) from None
            raise InvalidConfig(f"spec.class: {redact(exc.message, target.secrets)}") from None
        if problems := validation.errors(result, spec):
            raise InvalidConfig(validation.describe(problems, target.secrets))

    async def _write_ahead(self, target: Target, annotations: dict[str, str]) -> None:
        """Annotations the resource must carry before Connect is changed (they outlive an operator restart)."""
        try:
            found = await self.kube.patch_object(
                PLURAL, target.namespace, target.name, {"metadata": {"annotations": annotations}}
            )
        except ApiError as exc:
            raise ClaimFailed(f"cannot annotate the resource: {describe(exc)}") from None
        if not found:
            raise LookupError("the resource was deleted")
        target.meta = {**target.meta, "annotations": {**(target.meta.get("annotations") or {}), **annotations}}
        self._note_offsets_request(target)

    def _note_offsets_request(self, target: Target) -> None:
        annotations = target.meta.get("annotations") or {}
        last_seek = target.status.get("lastSeekNonce")
        target.offsets_request = offsets.request_for(annotations, target.name, target.spec, last_seek)
        self._acted_on(target)  # our own patch needs no new look at the spec

    async def _claim(self, target: Target, *, offsets_operation: str | None = None) -> None:
        """Write-ahead: claim the connector name, with our finalizer, before creating the connector.

        One patch carries both, so a crash between it and the create leaves a claim we recognise
        rather than a connector we would refuse to touch, and the resource cannot be deleted
        without its connector. The patch only adds: it never drops a finalizer someone else set.
        """
        assert target.spec is not None
        claim = {ANNOTATION_OWNED_CONNECTOR: target.spec.connector, ANNOTATION_CONNECT_CLUSTER: target.cluster}
        if offsets_operation:
            claim[ANNOTATION_OFFSETS] = offsets_operation
        ops = additions(target.meta, CONNECT_FINALIZER, claim)
        try:
            patched = await self.kube.patch_object(PLURAL, target.namespace, target.name, ops)
        except ApiError as exc:
            raise ClaimFailed(f"cannot claim the connector name on the resource: {describe(exc)}") from None
        if not patched:
            raise LookupError("the resource was deleted")
        target.claimed, target.disowned = True, ""
        target.meta = {
            **target.meta,
            "finalizers": [*target.finalizers, CONNECT_FINALIZER],
            "annotations": {**(target.meta.get("annotations") or {}), **claim},
        }
        if offsets_operation:
            self._note_offsets_request(target)

    async def _taken(self, client: ConnectClient, target: Target) -> None:
        """Our create found the name taken: the listing we decided on did not show the connector yet.

        With exactly the config we would have created it is ours (an earlier create whose answer was
        lost, or one from before a restart). Otherwise it is someone else's, created between that
        listing and our create: the claim written ahead of the create is withdrawn (the annotations and
        our finalizer), so this resource never updates, stops or deletes it — it reports
        ConnectorNotOwned from the next listing on.
        """
        assert target.spec is not None
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": target.spec.connector}
        if await client.config(target.spec.connector) == target.config:  # the owner key included
            target.config_verified = True
            target.connector_owner = target.owner
            log.info("connector already exists with this spec's config: taken as ours", extra=ctx)
            return
        ours = [ANNOTATION_OWNED_CONNECTOR, ANNOTATION_CONNECT_CLUSTER]
        if target.spec.created_at_offsets:
            ours.append(ANNOTATION_OFFSETS)  # written with the claim
        await self.kube.remove_annotation(PLURAL, target.namespace, target.name, *ours)
        if CONNECT_FINALIZER in target.finalizers:
            await self.kube.remove_finalizer(PLURAL, target.namespace, target.name, CONNECT_FINALIZER)
        annotations = {k: v for k, v in (target.meta.get("annotations") or {}).items() if k not in ours}
        finalizers = [f for f in target.finalizers if f != CONNECT_FINALIZER]
        target.meta = {**target.meta, "annotations": annotations, "finalizers": finalizers}
        target.claimed, target.disowned, target.offsets_request = False, target.spec.connector, None
        log.warning("connector created by someone else meanwhile: claim withdrawn, left untouched", extra=ctx)

    async def _execute(self, client: ConnectClient, target: Target, step: Step, outcome: Outcome) -> None:
        spec = target.spec
        assert spec is not None
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": spec.connector}
        if step in OFFSET_STEPS:
            await self.offsets.run(client, target, step, outcome)
            return
        if step in (Step.CREATE, Step.UPDATE_CONFIG):
            self._check_class(target)
        if step is Step.CREATE:
            first = spec.created_at_offsets
            if not target.claimed:  # a claimed one without our finalizer was claimed again in `_reconcile`
                await self._claim(target, offsets_operation=first)
            elif first:
                await self._write_ahead(target, {ANNOTATION_OFFSETS: first})
            # With onCreate: reset or a startFrom the connector is created STOPPED and its offsets reset or
            # moved before it runs: the annotation written ahead carries that through an operator restart.
            state = "STOPPED" if first else spec.connect_state
            try:
                await self._checked(client, target, client.create(spec.connector, target.config, state))
            except ConnectError as exc:
                if not exc.already_exists:
                    raise
                await self._taken(client, target)  # created meanwhile, by us or by someone else
                return
            target.config_verified = True
            target.connector_owner = target.owner  # created with our owner key
            target.created_at = time.monotonic()
            target.topics_due = target.created_at + self.policy.topics_after_create
            # No Event here: the Ready (or failure) Event follows within seconds, and a wave of creates
            # would otherwise put one more write per connector on the API server while Connect is busiest.
            log.info("connector created", extra={**ctx, "state": spec.connect_state})
        elif step is Step.UPDATE_CONFIG:
            await self._checked(client, target, client.put_config(spec.connector, target.config))
            target.config_verified = True
            log.info("connector config updated", extra=ctx)
            self.publisher.event(target, "ConfigUpdated", "connector configuration updated to match the spec")
        elif step is Step.SET_STATE:
            await client.set_state(spec.connector, spec.connect_state)
            log.info("connector state requested", extra={**ctx, "state": spec.connect_state})
        elif step is Step.RESTART:
            await client.restart(spec.connector, only_failed=False)
            log.info("connector restarted on request", extra=ctx)
            self.publisher.event(target, "Restarted", "connector and tasks restarted on request")
        elif step is Step.RESTART_FAILED:
            await client.restart(spec.connector, only_failed=True)
            log.warning("failed connector or tasks restarted", extra={**ctx, "restarts": target.restarts + 1})
            self.publisher.event(target, "AutoRestarted", f"automatic restart #{target.restarts + 1}", warning=True)
