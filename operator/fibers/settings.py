"""Everything the operator reads from its environment: the chart's values, as the Deployment passes them
(`charts/fibers/templates/deployment.yaml`), read once at start-up into one `Settings`.

Each variable is named here and nowhere else in the operator; a value that cannot be used stops the
start with a message naming the variable. The numbers tuned in code are each kind's policy's, not here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fibers.connect.registry import ClusterSettings
from fibers.connect.settings import SyncSettings
from fibers.podpolicy import PodPolicy
from fibers.reconciles import Pacing
from fibers.schemas.settings import SchemaSettings
from fibers.transform.spec import Defaults

NAMESPACES_ENV = "FIBERS_NAMESPACES"  # what `fibers run -n …` told kopf, comma-separated (none: the cluster)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
PEERING_LIFETIME = 60  # seconds; kopf's default (FIBERS_PEERING_LIFETIME, chart value standby.lifetimeSeconds)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {env.get(name)!r}") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name) or default)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {env.get(name)!r}") from None


def credential_namespaces(env: Mapping[str, str]) -> frozenset[str] | None:
    """Where ConnectCluster and SchemaRegistry Secrets may be (`fibers.credentials`); unset: anywhere."""
    listed = env.get("FIBERS_CREDENTIAL_NAMESPACES")
    return None if listed is None else frozenset(n.strip() for n in listed.split(",") if n.strip())


def transform_defaults(env: Mapping[str, str] = os.environ) -> Defaults:
    """What a Transform's (and a consumer's) pods get unless the spec says otherwise."""
    pull_policy = env.get("FIBERS_JOB_IMAGE_PULL_POLICY") or Defaults.image_pull_policy
    if pull_policy not in PULL_POLICIES:
        raise ValueError(f"FIBERS_JOB_IMAGE_PULL_POLICY must be one of {', '.join(PULL_POLICIES)}, not {pull_policy!r}")
    return Defaults(
        kafka_bootstrap=env.get("FIBERS_KAFKA_BOOTSTRAP") or None,
        image=env.get("FIBERS_JOB_IMAGE") or Defaults.image,
        image_pull_policy=pull_policy,
        service_account=env.get("FIBERS_JOB_SERVICE_ACCOUNT") or None,
        # Set and empty: no CPU request of Fibers' own (Spark then requests `cores` whole CPUs).
        core_request=env.get("FIBERS_SPARK_CORE_REQUEST", Defaults.core_request) or None,
        schema_registry=env.get("FIBERS_SCHEMA_REGISTRY_DEFAULT") or None,
        lineage_topic=env.get("FIBERS_LINEAGE_TOPIC") or None,
        lineage_bootstrap=env.get("FIBERS_LINEAGE_BOOTSTRAP") or None,
        lineage_namespace=env.get("FIBERS_LINEAGE_NAMESPACE") or Defaults.lineage_namespace,
        policy=PodPolicy.from_env(env),
    )


def lineage_from(defaults: Defaults) -> dict[str, str] | None:
    """Where consumers and connectors send OpenLineage events (Transforms get the same through their Defaults)."""
    bootstrap = defaults.lineage_bootstrap or defaults.kafka_bootstrap
    if not (defaults.lineage_topic and bootstrap):
        return None
    return {"topic": defaults.lineage_topic, "bootstrapServers": bootstrap, "namespace": defaults.lineage_namespace}


@dataclass(frozen=True)
class Settings:
    """The operator's deployment settings, one object per process."""

    connect: SyncSettings
    clusters: ClusterSettings
    schemas: SchemaSettings
    transform: Defaults
    pacing: Pacing
    lineage: dict[str, str] | None
    schema_registry: str | None  # the default SchemaRegistry (Schemas, Avro inputs and outputs, consumers)
    consumer_service_account: str | None  # consumer pods run the user's callback: an identity of their own
    namespaces: tuple[str, ...]  # watched namespaces (empty: the whole cluster)
    peering_lifetime: int  # with a standby: how long a silent peer counts as alive
    api_threads: int  # worker threads for API calls (0: the default pool)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        transform = transform_defaults(env)
        lineage = lineage_from(transform)
        secret_namespaces = credential_namespaces(env)
        return cls(
            connect=SyncSettings(
                interval=_float(env, "FIBERS_CONNECT_SYNC_INTERVAL", SyncSettings.interval),
                fast_interval=_float(env, "FIBERS_CONNECT_FAST_INTERVAL", SyncSettings.fast_interval),
                default_cluster=env.get("FIBERS_CONNECT_DEFAULT_CLUSTER") or None,
                lineage=lineage,
                kafka_bootstrap=env.get("FIBERS_KAFKA_BOOTSTRAP") or None,
                deletion_grace=_float(env, "FIBERS_CONNECT_DELETION_GRACE", SyncSettings.deletion_grace),
            ),
            clusters=ClusterSettings(
                refresh=_float(env, "FIBERS_CONNECT_CLUSTER_REFRESH", ClusterSettings.refresh),
                secret_namespaces=secret_namespaces,
            ),
            schemas=SchemaSettings(
                resync=_float(env, "FIBERS_SCHEMA_RESYNC", SchemaSettings.resync),
                secret_namespaces=secret_namespaces,
            ),
            transform=transform,
            pacing=Pacing(
                resync=_float(env, "FIBERS_RESYNC_SECONDS", Pacing.resync),
                workers=_int(env, "FIBERS_RECONCILE_WORKERS", Pacing.workers),
            ),
            lineage=lineage,
            schema_registry=env.get("FIBERS_SCHEMA_REGISTRY_DEFAULT") or None,
            consumer_service_account=env.get("FIBERS_CONSUMER_SERVICE_ACCOUNT") or transform.service_account,
            namespaces=tuple(n for n in env.get(NAMESPACES_ENV, "").split(",") if n),
            peering_lifetime=_int(env, "FIBERS_PEERING_LIFETIME", PEERING_LIFETIME),
            api_threads=_int(env, "FIBERS_API_THREADS", 0),
        )
