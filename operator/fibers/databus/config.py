"""The consumer's configuration, rendered by the operator and passed to `fibers consume`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConsumerConfig:
    name: str
    namespace: str
    topics: list[str]
    bootstrap_servers: str
    sink: dict[str, Any]
    checkpoint_config_map: str
    instance: int = 0
    instances: int = 1
    start_position: str = "bootstrap"  # when there is no checkpoint: bootstrap | earliest | latest
    bootstrap: dict[str, Any] | None = None  # {"uriEnv", "database"} of the bootstrap store
    checkpoint_min_interval: float = 1.0
    callback_timeout: float = 60.0
    retries: int = 5
    retry_backoff: float = 1.0
    max_window_events: int = 5000
    labels: dict[str, str] = field(default_factory=dict)
    registry_url: str | None = None  # values are Avro in the registry's wire format (spec.relay.avro)
    lineage: dict[str, str] | None = None  # {topic, bootstrapServers, namespace, job}: OpenLineage events go there

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConsumerConfig:
        relay, checkpoint, callback = data["relay"], data["checkpoint"], data.get("callback") or {}
        return cls(
            name=data["name"],
            namespace=data["namespace"],
            topics=list(relay["topics"]),
            bootstrap_servers=relay["bootstrapServers"],
            sink=dict(data["sink"]),
            checkpoint_config_map=checkpoint["configMapName"],
            instance=int(data.get("instance", 0)),
            instances=int(data.get("instances", 1)),
            start_position=data.get("startPosition", "bootstrap"),
            bootstrap=data.get("bootstrap"),
            checkpoint_min_interval=float(checkpoint.get("minIntervalSeconds", 1.0)),
            callback_timeout=float(callback.get("timeoutSeconds", 60)),
            retries=int(callback.get("retries", 5)),
            retry_backoff=float(callback.get("retryBackoffSeconds", 1)),
            labels=dict(data.get("labels") or {}),
            registry_url=(relay.get("avro") or {}).get("registryUrl"),
            lineage=data.get("lineage"),
        )

    def owns(self, partition: int) -> bool:
        """Exclusive ownership: instance i of n consumes the partitions p with p % n == i."""
        return partition % self.instances == self.instance
