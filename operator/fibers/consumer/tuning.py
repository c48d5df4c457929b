"""The consumer runtime's tuning: every number the relay loop runs by, with the reason for its value.

Measured with `bench/databus_throughput.py` and `bench/latency.py` on the local stack (2 cores).
The DatabusConsumer spec carries what a user decides (checkpoint interval, callback timeout and
retries); these are how the runtime reads the relay, and are not meant to be set.
"""

from __future__ import annotations

import gc
from typing import Final

# librdkafka settings the runtime adds to its Kafka consumer.
KAFKA_CONSUMER: Final = {
    # Once its local queue holds queued.min.messages (100,000) librdkafka waits this long before it
    # fetches again: 1,000 ms by default since librdkafka 2.4. A consumer catching up drains that queue
    # in well under a second and then sat idle, capped at ~120-150k events/s whatever its own speed;
    # at 10 ms the queue stays fed (a plain loop: 155k -> ~1M events/s) and an idle consumer does not spin.
    "fetch.queue.backoff.ms": 10,
}

# Records taken from librdkafka's queue per call: one hand-off to the callback thread per batch.
BATCH_RECORDS: Final = 1000

# Relay silence that ends an open transaction window: Debezium writes a transaction's events together,
# so a short pause means it is complete. It is the consumer's share of commit-to-sink latency at a low
# change rate (bench/latency.py: 50 of 82 ms p99 at 10 changes/s).
QUIET_SECONDS: Final = 0.05

# How long an idle consumer waits for the next record before it looks at its own work again
# (flushing a throttled checkpoint, noticing a stop request).
IDLE_WAIT_SECONDS: Final = 0.2

# How long a call for Kafka metadata (a topic's partitions, a partition's watermarks) may wait for the broker.
KAFKA_METADATA_TIMEOUT_SECONDS: Final = 30.0

# Rows per bootstrap page (snapshot rows or logged changes): one hand-off to the callbacks, one
# checkpoint and, after a failure, the unit that is delivered again. Small enough that a replay
# repeats little; large enough that the store's cursor and the checkpoint writes stay a small cost.
BOOTSTRAP_PAGE_ROWS: Final = 500

# The longest pause between two attempts at a failed window or bootstrap page (the policy's
# backoff doubles per attempt up to this).
MAX_RETRY_PAUSE_SECONDS: Final = 60.0

# A callback thread the driver gave up on (past the callback timeout) cannot be stopped, and no other thread
# may enter that callback until it has left (fibers.consumer.sinkset). The next attempt waits for it up to
# this many callback timeouts, so a call that ends late costs a wait, not the retries; one that never ends
# stops the consumer, whose restart ends it.
ABANDONED_WAIT_TIMEOUTS: Final = 5

# How long the Kafka sink waits for a batch's deliveries to be confirmed before it fails the batch (which
# is then replayed from its checkpoint), and how long it serves deliveries when librdkafka's queue is
# full before it queues the next record again.
KAFKA_SINK_FLUSH_SECONDS: Final = 30.0
KAFKA_SINK_QUEUE_FULL_WAIT_SECONDS: Final = 0.1

# Python's cyclic garbage collector looks at its young objects every 700 allocations by default. The
# relay loop keeps a batch of events (each with its row dicts) alive until the callbacks have run, so
# nearly every look found only live objects and moved them on to the older generations, where the
# larger sweeps scanned them again along with every module and client loaded at start-up: half the
# consumer's time (bench/databus_throughput: ~300k -> ~580k events/s with the settings below).
# Events are freed by reference counting; the collector is only for cycles, which the loop does not make.
GC_YOUNG_THRESHOLD: Final = 10_000


def settle_collector() -> None:
    """Tune the garbage collector for a consumer process, once its start-up is done.

    What start-up allocated (modules, the Kubernetes and Kafka clients) lives as long as the process:
    `gc.freeze` takes it out of the collector's sweeps. Young objects are then looked at every
    GC_YOUNG_THRESHOLD allocations rather than 700.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


# Partition ownership (fibers.consumer.ownership): one Lease per partition. Another pod may take a Lease
# whose record it has seen unchanged this long; its holder renews it this often and stops handing on the
# partition's windows if no renewal succeeded for the deadline — a margin of 4 s before anyone may take it
# (client-go's leader election keeps the same order: renew period < renew deadline < lease duration).
LEASE_DURATION_SECONDS: Final = 10.0
LEASE_RENEW_SECONDS: Final = 2.0
LEASE_RENEW_DEADLINE_SECONDS: Final = 6.0
# A stopping instance waits this long for its renewal thread, which is at most one API call from its end.
LEASE_THREAD_JOIN_SECONDS: Final = 5.0

# The API server away (a restart, throttling with 429): checkpoint reads and writes are tried again after
# a backoff that starts at API_RETRY_BASE_SECONDS and doubles up to API_RETRY_CAP_SECONDS (a Retry-After
# the server sends wins), the consumer pausing meanwhile; a warning is logged once it has waited
# API_WAIT_NOTICE_SECONDS. A stopping consumer waits at most API_SHUTDOWN_WAIT_SECONDS for its last
# checkpoint (the pod's 30 s grace must cover it and the Lease releases).
API_RETRY_BASE_SECONDS: Final = 0.5
API_RETRY_CAP_SECONDS: Final = 10.0
# An instance waiting this long for the API server to take its checkpoints answers its readiness probe with 503
# ("waiting for the API server for N s"): the pod turns NotReady, its consumer's readyInstances falls, and
# `kubectl get pods` shows it, while the status it cannot write says nothing.
API_WAIT_UNREADY_SECONDS: Final = 5.0
API_WAIT_NOTICE_SECONDS: Final = 5.0
API_SHUTDOWN_WAIT_SECONDS: Final = 10.0

# A Kafka broker, the bootstrap store or the schema registry not answering: the same read is tried
# again after a pause that starts here and doubles up to the cap (a stop request cuts it short).
TRANSIENT_RETRY_BASE_SECONDS: Final = 0.5
TRANSIENT_RETRY_CAP_SECONDS: Final = 10.0

# Looks in a row (one a second, after the server's own timeout) that may fail to start the timelines they
# took because Kafka or the bootstrap store did not answer, before the consumer stops and says why: a
# blip is ridden out, a wrong address or a server gone for good is shown on the resource.
TAKE_RETRIES: Final = 3

# Compare-and-swap attempts at the checkpoint ConfigMap in one go; instances of one consumer write it
# at once, so a few conflicts in a row are normal. Past this many the write waits like an outage.
CHECKPOINT_CONFLICT_TRIES: Final = 10

# How often the relay loop reads the number of instances and tries the Leases of partitions it wants but
# does not hold: the most a rescale waits on a pod noticing it (two looks, the giver's and the taker's).
OWNERSHIP_CHECK_SECONDS: Final = 1.0
