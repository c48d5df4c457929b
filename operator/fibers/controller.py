"""The operator process: kopf settings, shared clients, and every kind's handlers.

`fibers run` starts it. Importing this module registers the handlers with kopf.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from fibers import logs
from fibers.api import FINALIZER
from fibers.connect import handlers as _connect_handlers  # registers handlers
from fibers.connect.registry import ClusterSettings, ConnectClusters
from fibers.connect.spec import KIND as CONNECT_KIND
from fibers.connect.sync import ConnectSync, SyncSettings
from fibers.databus import handlers as _databus_handlers  # noqa: F401  (registers handlers)
from fibers.databus.reconciler import DatabusReconciler
from fibers.databus.workload import CHILDREN as DATABUS_CHILDREN
from fibers.databus.workload import KIND as DATABUS_KIND
from fibers.kube import Kube, load_client
from fibers.podpolicy import PodPolicy
from fibers.reconciles import Pacing, Reconciles
from fibers.schemas import handlers as _schema_handlers  # registers handlers
from fibers.schemas.operator import SchemaOperator
from fibers.schemas.reconcile import SchemaSettings
from fibers.transform import handlers as _transform_handlers  # registers handlers
from fibers.transform.reconciler import TransformReconciler
from fibers.transform.sparkapp import CHILDREN as TRANSFORM_CHILDREN
from fibers.transform.spec import KIND as TRANSFORM_KIND
from fibers.transform.spec import Defaults
from fibers.watches import ChildWatches, Scope

log = logging.getLogger("fibers.operator")

RECONCILED_KINDS = (CONNECT_KIND, TRANSFORM_KIND, DATABUS_KIND)  # fibers_reconciles_total{kind=…}

# Handlers called on every watch event: kopf's line after each call is dropped (`logs.WatchHandlerSuccess`).
_WATCHING: tuple[Callable[..., Any], ...] = (
    _connect_handlers.connect_event,
    _connect_handlers.connect_cluster_event,
    _connect_handlers.namespace_event,
    _transform_handlers.transform_event,
    _schema_handlers.registry_event,
    _schema_handlers.schema_event,
)
WATCH_HANDLERS = {handler.__qualname__ for handler in _WATCHING}  # kopf's handler ids


def settings_from_env() -> SyncSettings:
    return SyncSettings(
        interval=float(os.environ.get("FIBERS_CONNECT_SYNC_INTERVAL", str(SyncSettings.interval))),
        fast_interval=float(os.environ.get("FIBERS_CONNECT_FAST_INTERVAL", str(SyncSettings.fast_interval))),
        default_cluster=os.environ.get("FIBERS_CONNECT_DEFAULT_CLUSTER") or None,
        lineage=lineage_from(transform_defaults_from_env()),
        kafka_bootstrap=os.environ.get("FIBERS_KAFKA_BOOTSTRAP") or None,
        deletion_grace=float(os.environ.get("FIBERS_CONNECT_DELETION_GRACE", str(SyncSettings.deletion_grace))),
    )


def credential_namespaces_from_env() -> frozenset[str] | None:
    """Where ConnectCluster and SchemaRegistry Secrets may be (`fibers.credentials`); unset: anywhere."""
    listed = os.environ.get("FIBERS_CREDENTIAL_NAMESPACES")
    return None if listed is None else frozenset(n.strip() for n in listed.split(",") if n.strip())


def cluster_settings_from_env() -> ClusterSettings:
    return ClusterSettings(
        refresh=float(os.environ.get("FIBERS_CONNECT_CLUSTER_REFRESH", str(ClusterSettings.refresh))),
        secret_namespaces=credential_namespaces_from_env(),
    )


NAMESPACES_ENV = "FIBERS_NAMESPACES"  # what `fibers run -n …` told kopf, comma-separated (none: the cluster)


def pacing_from_env() -> Pacing:
    return Pacing(
        resync=float(os.environ.get("FIBERS_RESYNC_SECONDS", str(Pacing.resync))),
        workers=int(os.environ.get("FIBERS_RECONCILE_WORKERS", str(Pacing.workers))),
    )


def schema_settings_from_env() -> SchemaSettings:
    return SchemaSettings(
        resync=float(os.environ.get("FIBERS_SCHEMA_RESYNC", str(SchemaSettings.resync))),
        secret_namespaces=credential_namespaces_from_env(),
    )


def lineage_from(defaults: Defaults) -> dict[str, str] | None:
    """Where consumers send OpenLineage events (Transforms get the same through their Defaults)."""
    bootstrap = defaults.lineage_bootstrap or defaults.kafka_bootstrap
    if not (defaults.lineage_topic and bootstrap):
        return None
    return {"topic": defaults.lineage_topic, "bootstrapServers": bootstrap, "namespace": defaults.lineage_namespace}


PULL_POLICIES = ("Always", "IfNotPresent", "Never")
PEERING_LIFETIME = 60  # seconds; kopf's default (FIBERS_PEERING_LIFETIME, chart value standby.lifetimeSeconds)


def transform_defaults_from_env() -> Defaults:
    pull_policy = os.environ.get("FIBERS_JOB_IMAGE_PULL_POLICY") or Defaults.image_pull_policy
    if pull_policy not in PULL_POLICIES:
        raise ValueError(f"FIBERS_JOB_IMAGE_PULL_POLICY must be one of {', '.join(PULL_POLICIES)}, not {pull_policy!r}")
    return Defaults(
        kafka_bootstrap=os.environ.get("FIBERS_KAFKA_BOOTSTRAP") or None,
        image=os.environ.get("FIBERS_JOB_IMAGE") or Defaults.image,
        image_pull_policy=pull_policy,
        service_account=os.environ.get("FIBERS_JOB_SERVICE_ACCOUNT") or None,
        # Set and empty: no CPU request of Fibers' own (Spark then requests `cores` whole CPUs).
        core_request=os.environ.get("FIBERS_SPARK_CORE_REQUEST", Defaults.core_request) or None,
        schema_registry=os.environ.get("FIBERS_SCHEMA_REGISTRY_DEFAULT") or None,
        lineage_topic=os.environ.get("FIBERS_LINEAGE_TOPIC") or None,
        lineage_bootstrap=os.environ.get("FIBERS_LINEAGE_BOOTSTRAP") or None,
        lineage_namespace=os.environ.get("FIBERS_LINEAGE_NAMESPACE") or Defaults.lineage_namespace,
        policy=PodPolicy.from_env(),
    )


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
    settings.peering.lifetime = int(os.environ.get("FIBERS_PEERING_LIFETIME", str(PEERING_LIFETIME)))
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
    if threads := int(os.environ.get("FIBERS_API_THREADS", "0")):
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="kube"))
    kube = Kube(load_client())
    memo.kube = kube
    memo.connect_clusters = ConnectClusters(kube, cluster_settings_from_env())
    memo.connect = ConnectSync(kube, settings_from_env(), memo.connect_clusters)
    memo.connect_task = asyncio.create_task(memo.connect.run(), name="connect-sync")
    memo.connect_clusters_task = asyncio.create_task(memo.connect_clusters.run(), name="connect-clusters")
    memo.schemas = SchemaOperator(
        kube, schema_settings_from_env(), default_registry=os.environ.get("FIBERS_SCHEMA_REGISTRY_DEFAULT") or None
    )
    memo.schemas_task = asyncio.create_task(memo.schemas.run(), name="schema-registries")
    defaults = transform_defaults_from_env()
    reconciles = memo.reconciles = Reconciles(pacing_from_env())
    memo.transform = TransformReconciler(kube, defaults, reconciles.dependents)
    memo.databus = DatabusReconciler(
        kube,
        kafka_bootstrap=defaults.kafka_bootstrap,
        image=defaults.image,
        # Consumer pods run the user's callback: an identity of their own, without the Spark driver's rights.
        service_account=os.environ.get("FIBERS_CONSUMER_SERVICE_ACCOUNT") or defaults.service_account,
        image_pull_policy=defaults.image_pull_policy,
        schema_registry=defaults.schema_registry,
        lineage=lineage_from(defaults),
        dependents=reconciles.dependents,
        policy=defaults.policy,
    )
    reconciles.register(TRANSFORM_KIND, memo.transform.reconcile)
    reconciles.register(DATABUS_KIND, memo.databus.reconcile)
    memo.reconciles_task = asyncio.create_task(reconciles.run(), name="reconciles")
    # The children each kind creates, watched by label: a change is a reason to look at their owner.
    memo.watches = ChildWatches(kube.api, Scope(os.environ.get(NAMESPACES_ENV, "").split(",")))
    pacing = reconciles.pacing
    for kind, children, delay in (
        (DATABUS_KIND, DATABUS_CHILDREN, pacing.child_delay),
        (TRANSFORM_KIND, TRANSFORM_CHILDREN, pacing.run_delay),
    ):
        for child in children:
            memo.watches.add(child, _owner_changed(reconciles, kind, delay))
    log.info("operator started", extra={"connect_default": memo.connect.settings.default_cluster or "-"})


def _owner_changed(reconciles: Reconciles, kind: str, delay: float) -> Callable[[str, str], None]:
    def changed(namespace: str, owner: str) -> None:
        reconciles.nudge(kind, namespace, owner, delay)

    return changed


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.watches.stop()
    tasks = (memo.connect_task, memo.connect_clusters_task, memo.schemas_task, memo.reconciles_task)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await memo.connect.aclose()
    await memo.connect_clusters.aclose()
    await memo.schemas.aclose()
