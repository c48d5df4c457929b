"""The operator process: kopf settings, shared clients, and every kind's handlers.

`fibers run` starts it. Importing this module registers the handlers with kopf.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from fibers import logs
from fibers.api import FINALIZER
from fibers.connect import handlers as _connect_handlers  # registers handlers
from fibers.connect.clusters import PLURAL as CONNECT_CLUSTERS
from fibers.connect.registry import ConnectClusters
from fibers.connect.spec import KIND as CONNECT_KIND
from fibers.connect.spec import PLURAL as CONNECTS
from fibers.connect.sync import ConnectSync
from fibers.databus import handlers as _databus_handlers  # registers handlers
from fibers.databus.reconciler import DatabusReconciler
from fibers.databus.workload import CHILDREN as DATABUS_CHILDREN
from fibers.databus.workload import KIND as DATABUS_KIND
from fibers.databus.workload import PLURAL as CONSUMERS
from fibers.kube import Kube, custom, load_client
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles
from fibers.replay import handlers as _replay_handlers  # registers handlers
from fibers.replay.plan import KIND as REPLAY_KIND
from fibers.replay.plan import PLURAL as REPLAYS
from fibers.replay.reconciler import ReplayReconciler
from fibers.schemas import handlers as _schema_handlers  # registers handlers
from fibers.schemas.operator import SchemaOperator
from fibers.schemas.spec import PLURAL as SCHEMAS
from fibers.schemas.spec import REGISTRIES
from fibers.secret_refs import SecretRefs
from fibers.settings import Settings
from fibers.transform import handlers as _transform_handlers  # registers handlers
from fibers.transform.reconciler import TransformReconciler
from fibers.transform.sparkapp import CHILDREN as TRANSFORM_CHILDREN
from fibers.transform.spec import KIND as TRANSFORM_KIND
from fibers.transform.spec import PLURAL as TRANSFORMS
from fibers.watches import SECRETS, ChildWatches, Scope

log = logging.getLogger("fibers.operator")

RECONCILED_KINDS = (CONNECT_KIND, TRANSFORM_KIND, DATABUS_KIND)  # fibers_reconciles_total{kind=…}
CLUSTER_PLURALS = (CONNECT_CLUSTERS, REGISTRIES)
NAMESPACED_PLURALS = (CONNECTS, TRANSFORMS, CONSUMERS, SCHEMAS, REPLAYS)


# Handlers called on every watch event: kopf's line after each call is dropped (`logs.WatchHandlerSuccess`).
_WATCHING: tuple[Callable[..., Any], ...] = (
    _connect_handlers.connect_event,
    _connect_handlers.connect_cluster_event,
    _connect_handlers.namespace_event,
    _transform_handlers.transform_event,
    _databus_handlers.consumer_event,
    _schema_handlers.registry_event,
    _schema_handlers.schema_event,
    _replay_handlers.replay_event,
)
WATCH_HANDLERS = {handler.__qualname__ for handler in _WATCHING}  # kopf's handler ids


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own readers of the service account and the kubeconfig. Without a login handler kopf logs
    in through the `kubernetes` package whenever it is installed, and importing that costs ~17 MiB."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # With a standby (--peering): how long a silent peer counts as alive. A standby takes over at most
    # this long after the active operator died; the active one renews its record 5-10 s before it ends.
    config = Settings.from_env()
    settings.peering.lifetime = config.peering_lifetime
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.fibers.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.fibers.dev", key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # A resource deleted while its timer is mid-tick keeps its finalizer until kopf sees the timer
    # end; kopf looks again only after `cancellation_polling` (60 s by default), so a `kubectl delete`
    # could wait a minute. A tick is a few API calls: wait briefly, then re-check each second.
    settings.background.instant_exit_timeout = 2.0
    settings.background.cancellation_polling = 1.0
    # kopf would post an Event for every handler run ("Handler … succeeded"): two API writes per
    # object and noise in `kubectl describe`. Our own Events mark the transitions that matter;
    # kopf still posts its warnings and errors.
    settings.posting.level = logging.WARNING
    logging.getLogger("kopf.objects").addFilter(logs.WatchHandlerSuccess(WATCH_HANDLERS))
    # Kubernetes API calls run in worker threads (the client is synchronous). More threads than the
    # default (cpu+4) did not make 500 Connects Ready sooner here and cost ~15 MiB: opt-in only.
    if config.api_threads:
        executor = ThreadPoolExecutor(config.api_threads, thread_name_prefix="kube")
        asyncio.get_running_loop().set_default_executor(executor)
    kube = Kube(load_client())
    memo.kube = kube
    memo.connect_clusters = ConnectClusters(kube, config.clusters)
    memo.secret_refs = secret_refs = SecretRefs()  # who names which Secret: the Secrets watch's receivers
    memo.connect = ConnectSync(kube, config.connect, memo.connect_clusters, secret_refs=secret_refs)
    memo.connect_task = asyncio.create_task(memo.connect.run(), name="connect-sync")
    memo.connect_clusters_task = asyncio.create_task(memo.connect_clusters.run(), name="connect-clusters")
    memo.schemas = SchemaOperator(kube, config.schemas, default_registry=config.schema_registry)
    memo.schemas_task = asyncio.create_task(memo.schemas.run(), name="schema-registries")
    defaults = config.transform
    reconciles = memo.reconciles = Reconciles(config.pacing)
    memo.transform = TransformReconciler(kube, defaults, reconciles.dependents, secret_refs)
    memo.databus = DatabusReconciler(
        kube,
        kafka_bootstrap=defaults.kafka_bootstrap,
        image=defaults.image,
        # Consumer pods run the user's callback: an identity of their own, without the Spark driver's rights.
        service_account=config.consumer_service_account,
        image_pull_policy=defaults.image_pull_policy,
        schema_registry=defaults.schema_registry,
        lineage=config.lineage,
        dependents=reconciles.dependents,
        policy=defaults.policy,
        secret_refs=secret_refs,
    )
    reconciles.register(TRANSFORM_KIND, memo.transform.reconcile)
    reconciles.register(DATABUS_KIND, memo.databus.reconcile)
    reconciles.register(REPLAY_KIND, ReplayReconciler(kube, defaults.kafka_bootstrap, config.lineage).reconcile)
    memo.reconciles_task = asyncio.create_task(reconciles.run(), name="reconciles")
    # The children each kind creates, watched by label: a change is a reason to look at their owner.
    retry = (config.pacing.retry_min, config.pacing.retry_max)
    memo.watches = ChildWatches(kube.api, Scope(config.namespaces), retry)
    pacing = reconciles.pacing
    for kind, children, delay in (
        (DATABUS_KIND, DATABUS_CHILDREN, pacing.child_delay),
        (TRANSFORM_KIND, TRANSFORM_CHILDREN, pacing.run_delay),
    ):
        for child in children:
            memo.watches.add(child, _owner_changed(reconciles, kind, delay))
    # Every Secret of the served namespaces, by its metadata only: a change reaches the resources naming it.
    memo.watches.add(
        SECRETS,
        _secret_changed(memo, secret_refs, reconciles),
    )
    readiness: Readiness = memo.readiness
    readiness.gate(memo.watches.unanswered)
    readiness.gate(_keeping_up(reconciles, readiness.policy.queue_lag_seconds))
    readiness.started()
    memo.readiness_task = asyncio.create_task(
        readiness.take_stock((*CLUSTER_PLURALS, *NAMESPACED_PLURALS), _listing(kube, Scope(config.namespaces))),
        name="readiness",
    )
    log.info("operator started", extra={"connect_default": memo.connect.settings.default_cluster or "-"})


def _keeping_up(reconciles: Reconciles, lag: float) -> Callable[[], list[str]]:
    def behind() -> list[str]:
        waited = reconciles.behind()
        return [f"the reconcile queue: a reconcile has waited {waited:.0f} s for a worker"] if waited > lag else []

    return behind


def _listing(kube: Kube, scope: Scope) -> Callable[[str], Awaitable[set[tuple[str, str]]]]:
    """Each object of a kind the operator serves: cluster-scoped kinds everywhere, the others in its scope."""

    async def listing(plural: str) -> set[tuple[str, str]]:
        namespaces = [None] if plural in CLUSTER_PLURALS else scope.namespaces
        found: set[tuple[str, str]] = set()
        for namespace in namespaces:
            for item in await kube.items(custom(plural, namespace)):
                meta = item["metadata"]
                if plural in CLUSTER_PLURALS or scope.includes(meta["namespace"]):
                    found.add((meta.get("namespace") or "", meta["name"]))
        return found

    return listing


def _secret_changed(memo: kopf.Memo, refs: SecretRefs, reconciles: Reconciles) -> Callable[[str, str], None]:
    """A Secret changed (its metadata seen by the watch): the resources naming it look at it again, and
    the ConnectClusters and SchemaRegistries naming it (a few, each checks its own spec) read it again."""
    started: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)
    connect: ConnectSync = memo.connect
    clusters: ConnectClusters = memo.connect_clusters
    schemas: SchemaOperator = memo.schemas
    receivers: dict[str, DatabusReconciler | TransformReconciler] = {
        DATABUS_KIND: memo.databus,
        TRANSFORM_KIND: memo.transform,
    }

    def start(work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        started.add(task)
        task.add_done_callback(started.discard)

    def changed(namespace: str, secret: str) -> None:
        start(clusters.secret_changed(namespace, secret))
        start(schemas.secret_changed(namespace, secret))
        for kind, name in refs.referring(namespace, secret):
            if kind == CONNECT_KIND:
                start(connect.secret_changed(namespace, name, secret))
            elif receiver := receivers.get(kind):
                receiver.secret_changed(namespace, name, secret)
                reconciles.nudge(kind, namespace, name, 0.0)

    return changed


def _owner_changed(reconciles: Reconciles, kind: str, delay: float) -> Callable[[str, str], None]:
    def changed(namespace: str, owner: str) -> None:
        reconciles.nudge(kind, namespace, owner, delay)

    return changed


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.watches.stop()
    tasks = [
        memo.connect_task,
        memo.connect_clusters_task,
        memo.schemas_task,
        memo.reconciles_task,
        memo.readiness_task,
    ]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await memo.connect.aclose()
    await memo.connect_clusters.aclose()
    await memo.schemas.aclose()
