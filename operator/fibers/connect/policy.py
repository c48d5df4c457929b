"""The Connect reconciler's tuned numbers, in one place, each with the reason for its value.

Two kinds of setting pace the Connect reconciler:

- Given by the deployment (environment, chart, command line), with their defaults where they are
  read (`fibers.controller`): `SyncSettings` in `fibers.connect.sync` — `interval`
  (FIBERS_CONNECT_SYNC_INTERVAL, chart `connect.syncIntervalSeconds`), `fast_interval`
  (FIBERS_CONNECT_FAST_INTERVAL), `default_cluster` (FIBERS_CONNECT_DEFAULT_CLUSTER, `--connect-cluster`),
  `deletion_grace` (FIBERS_CONNECT_DELETION_GRACE, chart `connect.deletionGraceSeconds`) and the lineage
  settings — and `ClusterSettings.refresh` in `fibers.connect.registry`
  (FIBERS_CONNECT_CLUSTER_REFRESH, chart `connect.clusterRefreshSeconds`).
- Learnt from benchmarks and fixed in code: `ConnectPolicy` below. Nothing outside sets them; the
  sync loop and the ConnectCluster registry hold one as `self.policy` (`POLICY` unless a test passes
  its own), and `reconcile` reads `POLICY` for the rebalance grace.

Times are in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectPolicy:
    """Every number the Connect reconciler was tuned with, grouped by concern; one line each says why."""

    # ----- sync pace (the intervals themselves are SyncSettings') ---------------------------------
    # Shortest wait between two passes of the loop, however soon a cluster is due. Each cluster is synced at
    # most every (fast) interval anyway; 0.2 s here held a converging cluster to a listing every ~0.45 s.
    tick_floor: float = 0.05
    # A cluster is listed no sooner than this many seconds per connector it lists, nudged or not: a status
    # listing of 1,000 connectors takes a quiet Connect 7-9 ms and the operator ~15-30 ms to read (profiled),
    # so one every 0.5 s costs a few % of a core, where the fast pace had made 173 listings in a 50 s wave on
    # the cores Connect's creates need. Below 500 connectors the fast interval rules. (Spacing by how long the
    # last listing took fails: under a wave of creates a listing waits in the herder's queue, 0.4 s once,
    # and new resources then waited seconds for their create.)
    listing_spacing_per_connector: float = 0.0005
    # While more reconciles are in flight on a cluster than it is sent calls at once (`parallel_calls`),
    # a listing cannot start a create any sooner (the queued ones go first); it only reports Ready
    # earlier, so it comes at most this often. In a wave of 1,000 the operator listed ~140 times in
    # 47 s, each answer ~20 ms of Connect's CPU and ~25 ms of the operator's, on the cores the creates need.
    saturated_listing_spacing: float = 1.0
    # Pause after a wake-up, so a burst of applies is synced together, not once each: 100 applies from
    # 16 clients reach the operator within ~0.2 s, and later arrivals join the next (fast) sync.
    burst_gather: float = 0.05
    # A converging connector that looks as it did at its last reconcile, which had nothing to do, is
    # reconciled again only after this long (or as soon as it moves): 1,000 connectors starting together
    # were reconciled ~100 times each at the fast pace, the operator's largest cost of such a wave.
    # It equals startup_status_every, so a progress status held back by that is written in time.
    converging_recheck: float = 3.0
    status_heartbeat: float = 300.0  # rewrite an unchanged status this often (lastSyncTime)

    # ----- config reads (`fibers.connect.config_reads`) ----------------------------------------------
    # A listing with configs is asked at most every this many times as long as the last one took (and at
    # most every interval): ~5 % of Connect's herder time. At 1,000 connectors it answers in well under a
    # second, so the interval rules; its cost grows faster than the connectors.
    config_read_spacing_factor: float = 20.0
    # After a listing with configs Connect did not answer within `call_timeout` (its herder busy starting
    # thousands of tasks: 249-301 s at 5,000), configs are asked again only after this long. Each such
    # listing still queues one request per connector in the herder; statuses carry the sync meanwhile.
    config_read_retry: float = 300.0
    # A configs listing not answered within this long is joined by a statuses-only listing: if configs
    # never come, the statuses are already on their way, and a Connect that answers neither (a partition)
    # is unreachable after one `call_timeout`, not two. Below a listing's usual time at 1,000 connectors
    # under load, so at rest there is no second call.
    statuses_alongside_configs_after: float = 2.0

    # ----- creation --------------------------------------------------------------------------------
    # A connector is not created again this soon after our create succeeded: Connect's listing shows a
    # new connector only after its herder has caught up, and a second POST would only queue a 409 there.
    create_settle: float = 10.0

    # ----- startup status --------------------------------------------------------------------------
    # A new resource's first status and its progress (Creating → Starting, task counts) are written at
    # most this often; Ready and failures at once. A wave of 500 creates spared ~300 status writes this way.
    startup_status_every: float = 3.0

    # ----- topics (asked of Connect until a connector reports some) --------------------------------
    topics_after_create: float = 2.0  # first ask after a create: a connector reports topics once it has written
    topic_ask_base: float = 2.0  # an empty answer is asked again after base**n s (the n-th ask): 2, 4, 8, 16 …
    topic_ask_max: float = 60.0  # … up to this: seconds before asking again for a connector that reported none
    # No topic asks (nor periodic config reads) on a cluster while a connector we created this recently is
    # not Ready yet: the last connectors' Ready statuses of a wave of 100 waited 0.4-0.7 s behind ~40 asks
    # and the status writes they brought. A connector that does not start holds them back no longer than this.
    topics_wait_for_starting: float = 30.0
    # … and none (nor periodic config reads) while Connect's listing shows any of our connectors not started
    # (`fibers.connect.tasks_starting`), until that number has not moved for this long: at 5,000 connectors
    # Connect started ~1.5-5 tasks/s for 17 minutes, so a stall this long means a connector that will not get
    # a task (a worker gone) rather than a busy Connect.
    tasks_starting_patience: float = 60.0
    topic_fast_asks: int = 4  # asks for a new connector's topics made at the fast pace (after 2, 4, 8, 16 s)
    topic_refreshes: int = 2  # asks per cluster per sync at rest, for connectors whose topics are not known yet
    topic_refreshes_converging: int = 64  # the same while connectors converge (topic look-ups are cheap)

    # ----- deletion --------------------------------------------------------------------------------
    delete_retry: float = 10.0  # seconds between attempts to delete a connector Connect would not delete
    delete_confirm: float = 30.0  # DELETE answers before the herder has removed it: wait this long to see it gone
    delete_confirm_poll: float = 0.5  # … asking whether it still exists this often

    # ----- task health -----------------------------------------------------------------------------
    unassigned_grace: float = 30.0  # a rebalance moves tasks through UNASSIGNED briefly: Ready stays True that long

    # ----- calls to Connect, and the ConnectCluster probes (their pace at rest is ClusterSettings') --
    parallel_calls: int = 16  # concurrent calls to one Connect cluster: its herder serialises changes, more only queue
    call_timeout: float = 15.0  # a REST call to Connect not answered by then counts as unreachable
    unreachable_retry: float = 2.0  # a cluster that does not answer is listed again this often (not at the fast pace)
    unreachable_log_every: float = 300.0  # an unchanged outage is logged again this often (once when it starts)
    probe_retry: float = 10.0  # seconds between probes of a cluster that could not be probed
    probe_floor: float = 0.5  # shortest wait between two passes of the probe loop


POLICY = ConnectPolicy()
