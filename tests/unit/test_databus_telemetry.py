"""A consumer pod's /metrics: the series a scrape makes of the runtime's figures (no servers)."""

from __future__ import annotations

import dataclasses
import time
import urllib.error
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fibers.consumer.telemetry import SinkFigures, Snapshot, Telemetry, Timeline
from fibers_stack import process


def samples(telemetry: Telemetry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(telemetry.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset({"name": "orders-view", **labels}.items())))


def test_a_scrape_reports_the_runtimes_figures_of_that_moment() -> None:
    written = time.time() - 42
    figures = Snapshot(
        events=1200,
        mode="BOOTSTRAP_CATCHUP",
        sinks=[SinkFigures("view", 30, 2, 1), SinkFigures("feed", 31, 0, 0)],
        timelines=[
            Timeline("shop.orders", 0, 7, written),
            Timeline("shop.orders", 1, None, None),  # just taken: no position, nothing written yet
        ],
        checkpoint_writes=9,
        rollbacks={"online": 3, "bootstrap": 1},
        attempt=2,
    )
    current = [figures]
    telemetry = Telemetry("orders-view", lambda: current[0])
    found = samples(telemetry)

    expected = {
        ("fibers_consumer_events_total", ()): 1200,
        ("fibers_consumer_windows_total", (("sink", "feed"),)): 31,
        ("fibers_consumer_callback_errors_total", (("sink", "view"),)): 2,
        ("fibers_consumer_callback_timeouts_total", (("sink", "view"),)): 1,
        ("fibers_consumer_rollbacks_total", (("phase", "bootstrap"),)): 1,
        ("fibers_consumer_retry_attempt", ()): 2,
        ("fibers_consumer_checkpoint_writes_total", ()): 9,
        ("fibers_consumer_timelines", ()): 2,
    }
    assert {key: value(found, key[0], **dict(key[1])) for key in expected} == expected
    modes = {
        m: value(found, "fibers_consumer_mode", mode=m) for m in ("INIT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION")
    }
    assert modes == {"INIT": 0, "BOOTSTRAP_CATCHUP": 1, "ONLINE_CONSUMPTION": 0}
    assert value(found, "fibers_consumer_lag", topic="shop.orders", partition="0") == 7
    age = value(found, "fibers_consumer_checkpoint_age_seconds", topic="shop.orders", partition="0")
    assert age is not None and 42 <= age < 60
    # A partition without a position has no lag and no age (not a made-up 0).
    assert value(found, "fibers_consumer_lag", topic="shop.orders", partition="1") is None
    assert value(found, "fibers_consumer_checkpoint_age_seconds", topic="shop.orders", partition="1") is None

    # The next scrape reads the runtime again: a given-up partition's series are gone.
    current[0] = Snapshot(1300, "ONLINE_CONSUMPTION", [], [], 10, {"online": 3, "bootstrap": 1}, 0)
    found = samples(telemetry)
    assert value(found, "fibers_consumer_events_total") == 1300
    assert value(found, "fibers_consumer_lag", topic="shop.orders", partition="0") is None
    assert value(found, "fibers_consumer_mode", mode="ONLINE_CONSUMPTION") == 1


def test_latency_counts_only_changes_with_a_source_time_and_callbacks_are_timed_per_sink() -> None:
    telemetry = Telemetry("orders-view", lambda: Snapshot(0, "INIT", [], [], 0, {}, 0))
    now_ms = int(time.time() * 1000)
    telemetry.applied([now_ms - 2000, 0, now_ms - 200])  # 0: a record without Debezium's ts_ms
    timer = telemetry.sink_timer("view")
    timer(0.003)
    timer(0.4)
    found = samples(telemetry)
    assert value(found, "fibers_consumer_window_latency_seconds_count") == 2
    assert value(found, "fibers_consumer_window_latency_seconds_bucket", le="0.1") == 0
    assert value(found, "fibers_consumer_window_latency_seconds_bucket", le="0.25") == 1
    assert value(found, "fibers_consumer_window_latency_seconds_bucket", le="2.5") == 2
    assert value(found, "fibers_consumer_callback_seconds_count", sink="view") == 2
    assert value(found, "fibers_consumer_callback_seconds_bucket", sink="view", le="0.005") == 1


def test_two_runtimes_in_one_process_keep_their_own_series() -> None:
    a = Telemetry("a", lambda: Snapshot(1, "INIT", [], [], 0, {}, 0))
    b = Telemetry("b", lambda: Snapshot(2, "INIT", [], [], 0, {}, 0))
    assert [k for k in samples(a) if k[0] == "fibers_consumer_events_total"] == [
        ("fibers_consumer_events_total", frozenset({("name", "a")}))
    ]
    assert any(k[0] == "fibers_consumer_events_total" for k in samples(b))


def test_ready_until_the_api_server_has_not_taken_checkpoints_for_a_while_and_metrics_still_served() -> None:
    base = Snapshot(
        events=0, mode="ONLINE_CONSUMPTION", sinks=[], timelines=[], checkpoint_writes=0, rollbacks={}, attempt=0
    )
    current = [base]
    telemetry = Telemetry("orders-view", lambda: current[0])
    port = process.free_port("127.0.0.1")
    telemetry.serve(port)

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert get("/ready") == (200, "ready")
    current[0] = dataclasses.replace(base, api_waiting_since=time.time() - 1)  # a moment's wait: still ready
    assert get("/ready")[0] == 200
    since = time.time() - 30
    current[0] = dataclasses.replace(base, api_waiting_since=since)
    status, text = get("/ready")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    assert (status, text) == (503, f"waiting for the API server to take its checkpoints since {stamp}")
    status, text = get("/metrics")
    assert status == 200 and "fibers_consumer_api_waiting_seconds" in text
    # Waiting for its relay topic: not ready from the start, and said before anything else.
    current[0] = dataclasses.replace(base, waiting_for="relay topic orders does not exist yet")
    assert get("/ready") == (503, "relay topic orders does not exist yet")
