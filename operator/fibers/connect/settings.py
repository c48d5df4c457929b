"""What a deployment gives the Connect reconciler: the chart's values, read from the environment by
`fibers.controller` (or given by a test). The numbers tuned in code are `policy.ConnectPolicy`'s."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SyncSettings:
    """What the deployment gives the sync (environment, chart, command line; see `fibers.controller`).
    The numbers tuned in code are `ConnectPolicy`'s."""

    interval: float = 10.0  # at rest: one listing per cluster per interval
    # While some connector converges: a status-only listing is cheap. It is the shortest pace; a cluster with
    # many connectors is listed less often (`ConnectPolicy.listing_spacing_per_connector`). Each listing is a
    # request in the herder's queue, between the creates of a wave.
    fast_interval: float = 0.25
    default_cluster: str | None = None  # the ConnectCluster of Connects without spec.cluster (chart value)
    lineage: dict[str, str] | None = None  # {topic, bootstrapServers, namespace} of OpenLineage events; None: off
    kafka_bootstrap: str | None = None  # the connectors' Kafka, to name their topics in lineage events
    # A Connect being deleted whose Kafka Connect has not answered for this long is released without its
    # connector being deleted (`fibers.connect.deletion`): an outage of a few minutes (a rolling restart)
    # is waited out, a cluster gone for good does not hold the resource and its namespace for ever.
    deletion_grace: float = 600.0
