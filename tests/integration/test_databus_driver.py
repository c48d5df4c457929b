"""The callback driver: bootstrap pages and relay windows, one callback or several.

- Bootstrap: a store consumer fills the bootstrap store (MongoDB protocol, the stack's FerretDB) from a
  Kafka topic; a second consumer, run as `fibers consume` (what consumer pods run), bootstraps from it
  through a user callback that fails, hangs or never succeeds, and writes a journal of every call it
  got. Snapshot and catch-up pages get the relay's timeout, rollback and retries.
- Several sinks: one consumer feeds a MongoDB view, a Kafka topic and two user callbacks; one callback
  fails once, and every sink is rolled back to the same checkpoint.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers.consumer.store import collection_suffix
from fibers.consumer.tuning import BOOTSTRAP_PAGE_ROWS
from fibers.databus.checkpoint import ConsumptionMode
from fibers.databus.timelines import STATS_ANNOTATION, timeline_key
from fibers_stack import StackInfo
from tests.helpers import latest_rows, produce, read_records, wait_for
from tests.integration.test_databus import consumer_config, run_consumer, stored_checkpoint

pytestmark = pytest.mark.databus

CALLBACK = '''
import json, pathlib, time
from fibers.consumer.callbacks import Callback, Result

class Recorder(Callback):
    """Writes every bootstrap call to a journal; fails, hangs or always fails where the test says."""

    def __init__(self, journal, fail_snapshot_key=None, fail_catchup=False, hang_key=None, always_fail=False,
                 go_file=None, fail_offset=None):
        self.journal = pathlib.Path(journal)
        self.fail_offset = int(fail_offset) if fail_offset is not None else None
        self.fail_snapshot_key, self.fail_catchup = fail_snapshot_key, fail_catchup
        self.hang_key, self.always_fail, self.go_file = hang_key, always_fail, go_file

    def note(self, *entry):
        with self.journal.open("a") as f:
            f.write(json.dumps(entry) + "\\n")

    def on_start_bootstrap_sequence(self, scn):
        if self.go_file:  # hold the first page until the test has written more changes to the store
            while not pathlib.Path(self.go_file).exists():
                time.sleep(0.1)
            self.go_file = None
        return Result.SUCCESS

    def on_bootstrap_event(self, event):
        if self.always_fail:
            raise RuntimeError(f"cannot take {event.key}")
        if event.window == "snapshot" and event.key == self.fail_snapshot_key:
            self.fail_snapshot_key = None
            self.note("fail", event.window, event.key)
            raise RuntimeError(f"snapshot row {event.key} refused once")
        if event.window == "catchup" and self.fail_catchup:
            self.fail_catchup = False
            self.note("fail", event.window, event.key)
            return Result.ERROR
        if event.key == self.hang_key:
            self.hang_key = None
            self.note("hang", event.window, event.key)
            time.sleep(8)
        self.note("event", event.window, event.key, event.scn)
        return Result.SUCCESS

    def on_data_event(self, event):
        if event.offset == self.fail_offset:
            self.fail_offset = None
            self.note("fail", "relay", event.key)
            raise RuntimeError(f"offset {event.offset} refused once")
        self.note("event", "relay", event.key, event.offset)
        return Result.SUCCESS

    def on_error(self, error):
        self.note("error", str(error))
        return Result.SUCCESS

    def on_rollback(self, scn):
        self.note("rollback", scn)
        return Result.SUCCESS

    on_bootstrap_error = on_error
    on_bootstrap_rollback = on_rollback
'''


def journal_entries(journal: Path) -> list[list[Any]]:
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []


def view_mode(kube: ApiClient, namespace: str, topic: str) -> ConsumptionMode | None:
    """The consumption mode in the view consumer's checkpoint ConfigMap (None before its first write)."""
    cp = stored_checkpoint(kube, namespace, f"{topic}-view", timeline_key(topic, 0))
    return cp.consumption_mode if cp is not None else None


class Bootstrap:
    """A topic, a store consumer keeping the bootstrap store of it, and the view consumers started against it."""

    def __init__(self, stack_info: StackInfo, namespace: str, unique: str, tmp_path: Path) -> None:
        self.stack_info, self.namespace, self.unique, self.tmp_path = stack_info, namespace, unique, tmp_path
        self.database = f"{unique}s"
        self.mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
        admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
        admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
        (tmp_path / "recorder.py").write_text(CALLBACK)
        store = consumer_config(
            f"{unique}-store",
            namespace,
            unique,
            stack_info,
            {"type": "bootstrap", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": self.database},
        )
        self.procs = [run_consumer(stack_info, store, tmp_path / "store.log")]

    def store_offset(self) -> int:
        applier = self.mongo[self.database][f"applier_{collection_suffix(self.unique)}"].find_one({"_id": 0})
        return int(applier["offset"]) if applier else -1

    def produce(self, values: list[dict[str, Any]]) -> None:
        produce(self.stack_info.kafka_bootstrap, self.unique, values, key="id")

    def view(self, callback_options: dict[str, Any], policy: dict[str, Any]) -> Any:
        config = consumer_config(
            f"{self.unique}-view",
            self.namespace,
            self.unique,
            self.stack_info,
            {"type": "callback", "callback": "recorder:Recorder", "options": callback_options},
            bootstrap={"uriEnv": "FIBERS_BOOTSTRAP_MONGODB_URI", "database": self.database},
            startPosition="bootstrap",
            callback=policy,
        )
        env = {"PYTHONPATH": str(self.tmp_path), "FIBERS_TERMINATION_LOG": str(self.tmp_path / "termination")}
        proc = run_consumer(self.stack_info, config, self.tmp_path / "view.log", env)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(30)


@pytest.fixture
def bootstrap(stack_info: StackInfo, namespace: str, unique: str, tmp_path: Path) -> Any:
    setup = Bootstrap(stack_info, namespace, unique, tmp_path)
    yield setup
    setup.stop()


def test_failed_bootstrap_pages_roll_back_and_resume_from_their_checkpoint(
    bootstrap: Bootstrap, kube: ApiClient, namespace: str, unique: str, tmp_path: Path
) -> None:
    rows = 1200  # three snapshot pages
    bootstrap.produce([{"id": i, "v": 0} for i in range(rows)])
    wait_for(lambda: bootstrap.store_offset() == rows - 1, timeout=90, what="the store holds every row")
    journal, go = tmp_path / "journal.jsonl", tmp_path / "go"
    keys = sorted(str(i) for i in range(rows))  # snapshot pages are in key order
    failing = "700"
    assert keys.index(failing) >= BOOTSTRAP_PAGE_ROWS, "the failure must fall in a later page than the first"
    bootstrap.view(
        {"journal": str(journal), "fail_snapshot_key": failing, "fail_catchup": True, "go_file": str(go)},
        {"retries": 3, "retryBackoffSeconds": 0.2, "timeoutSeconds": 120},
    )
    wait_for(
        lambda: view_mode(kube, namespace, unique) is ConsumptionMode.BOOTSTRAP_SNAPSHOT,
        timeout=60,
        what="the view's snapshot began (its start SCN is fixed)",
    )
    # While the view's first page is held, the store applies 100 more changes: the catch-up's work.
    bootstrap.produce([{"id": i, "v": 1} for i in range(100)])
    wait_for(lambda: bootstrap.store_offset() == rows + 99, timeout=90, what="the store applied the updates")
    go.touch()
    wait_for(
        lambda: view_mode(kube, namespace, unique) is ConsumptionMode.ONLINE_CONSUMPTION,
        timeout=120,
        what="the view finished its bootstrap",
    )
    entries = journal_entries(journal)
    assert [e[0] for e in entries if e[0] in ("fail", "error", "rollback")] == [
        "fail",
        "error",
        "rollback",
        "fail",
        "error",
        "rollback",
    ], entries
    rollbacks = [e[1] for e in entries if e[0] == "rollback"]
    assert rollbacks == [0, rows - 1], "snapshot: its since-SCN (0); catch-up: the bootstrap's start SCN"
    assert "snapshot row 700 refused once" in next(e[1] for e in entries if e[0] == "error")

    snapshot = Counter(e[2] for e in entries if e[0] == "event" and e[1] == "snapshot")
    assert set(snapshot) == set(keys), "every row reached the callback"
    page = keys.index(failing) // BOOTSTRAP_PAGE_ROWS
    first_of_page = page * BOOTSTRAP_PAGE_ROWS
    replayed = keys[first_of_page : keys.index(failing)]
    assert all(snapshot[k] == 1 for k in keys[:first_of_page]), "pages before the failure were not replayed"
    assert all(snapshot[k] == 2 for k in replayed), "the failed page was delivered again from its start"
    assert all(snapshot[k] == 1 for k in keys[keys.index(failing) :]), "rows after the failure arrived once"

    catchup = [e for e in entries if e[0] == "event" and e[1] == "catchup"]
    assert sorted(int(e[2]) for e in catchup) == list(range(100)), "each logged change once after the rollback"
    assert sorted(e[3] for e in catchup) == list(range(rows, rows + 100))


def test_a_hung_bootstrap_callback_times_out_and_is_replayed(
    bootstrap: Bootstrap, kube: ApiClient, namespace: str, unique: str, tmp_path: Path
) -> None:
    bootstrap.produce([{"id": i, "v": 0} for i in range(20)])
    wait_for(lambda: bootstrap.store_offset() == 19, timeout=90, what="the store holds every row")
    journal = tmp_path / "journal.jsonl"
    bootstrap.view(
        {"journal": str(journal), "hang_key": "5"},
        {"retries": 2, "retryBackoffSeconds": 0.2, "timeoutSeconds": 2},
    )
    wait_for(
        lambda: view_mode(kube, namespace, unique) is ConsumptionMode.ONLINE_CONSUMPTION,
        timeout=90,
        what="the view finished its bootstrap after the timeout",
    )
    entries = journal_entries(journal)
    kinds = [e[0] for e in entries if e[0] in ("hang", "error", "rollback")]
    assert kinds == ["hang", "error", "rollback"], entries
    assert "took over 2s" in next(e[1] for e in entries if e[0] == "error")
    # The replay began once the hung call had returned (a thread given up on cannot be stopped, and one
    # still writing beside its replay landed older rows after newer ones): its own row comes next.
    hung = [e[0] for e in entries].index("hang")
    assert next(e for e in entries[hung + 1 :] if e[0] == "event")[2] == "5", entries
    delivered = {e[2] for e in entries if e[0] == "event" and e[1] == "snapshot"}
    assert delivered == {str(i) for i in range(20)}


def test_a_bootstrap_that_keeps_failing_stops_naming_source_scn_and_error(
    bootstrap: Bootstrap, unique: str, tmp_path: Path
) -> None:
    bootstrap.produce([{"id": i, "v": 0} for i in range(5)])
    wait_for(lambda: bootstrap.store_offset() == 4, timeout=90, what="the store holds every row")
    journal = tmp_path / "journal.jsonl"
    proc = bootstrap.view({"journal": str(journal), "always_fail": True}, {"retries": 2, "retryBackoffSeconds": 0.1})
    assert proc.wait(90) != 0
    message = (tmp_path / "termination").read_text()
    assert message.startswith(f"bootstrap snapshot of {unique} failed at SCN 4 3 times: "), message
    assert "cannot take" in message
    assert [e[0] for e in journal_entries(journal)].count("rollback") == 3


def test_several_sinks_get_every_window_and_one_failing_rolls_them_all_back(
    stack_info: StackInfo, kube: ApiClient, namespace: str, unique: str, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    (tmp_path / "recorder.py").write_text(CALLBACK)
    count, keys = 400, 100
    produce(stack_info.kafka_bootstrap, unique, [{"id": i % keys, "v": i} for i in range(count)], key="id")
    journals = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    feed = f"{unique}-feed"
    sinks = [
        {"type": "mongodb", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": unique, "collection": "rows",
         "name": "view"},
        {"type": "kafka", "topic": feed, "name": "feed"},
        {"type": "callback", "callback": "recorder:Recorder", "name": "a",
         "options": {"journal": str(journals["a"]), "fail_offset": "250"}},
        {"type": "callback", "callback": "recorder:Recorder", "name": "b", "options": {"journal": str(journals["b"])}},
    ]  # fmt: skip
    config = consumer_config(unique, namespace, unique, stack_info, sinks[0], callback={"retryBackoffSeconds": 0.2})
    del config["sink"]
    config["sinks"] = sinks
    proc = run_consumer(stack_info, config, tmp_path / "consumer.log", {"PYTHONPATH": str(tmp_path)})
    try:
        expected = {str(k): {"id": k, "v": count - keys + k} for k in range(keys)}
        mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
        wait_for(
            lambda: {d["_id"]: {"id": d["id"], "v": d["v"]} for d in mongo[unique]["rows"].find()} == expected,
            timeout=90,
            what="the MongoDB view has every row's last value",
        )
        wait_for(
            lambda: latest_rows(read_records(stack_info.kafka_bootstrap, feed, idle=1), ("id", "v")) == expected,
            timeout=60,
            what="the Kafka feed has every row's last value",
        )
        wait_for(
            lambda: all(
                {e[3] for e in journal_entries(j) if e[0] == "event"} == set(range(count)) for j in journals.values()
            ),
            timeout=60,
            what="both callbacks got every record",
        )
    finally:
        proc.terminate()
        proc.wait(30)
    for name, journal in journals.items():
        entries = journal_entries(journal)
        rollbacks = [i for i, e in enumerate(entries) if e[0] == "rollback"]
        assert len(rollbacks) == 1, (name, entries)  # a's failure rolled back b (and the built-in sinks) too
        assert any(e[0] == "error" and e[1].startswith("sink a: offset 250 refused once") for e in entries)
        committed = entries[rollbacks[0]][1]
        assert committed < 250
        offsets = Counter(e[3] for e in entries if e[0] == "event")
        assert all(offsets[o] == 1 for o in range(committed + 1)), f"{name} saw a committed window twice"
        replay = next(e for e in entries[rollbacks[0] :] if e[0] == "event")
        assert replay[3] == committed + 1, "the replay starts right after the checkpoint"
    stats = stored_stats(kube, namespace, unique)
    figures = {sink["name"]: sink for sink in stats["sinks"]}
    assert list(figures) == ["view", "feed", "a", "b"]  # in the spec's order
    assert figures["a"]["errors"] == 1 and figures["b"]["errors"] == 0 and figures["view"]["errors"] == 0
    assert all(f["windows"] >= count for f in figures.values())


def stored_stats(kube: ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The figures the consumer left with its checkpoints (instance 0), as the operator mirrors them."""
    from kubernetes import client

    cm = client.CoreV1Api(kube).read_namespaced_config_map(f"{name}-checkpoint", namespace)
    return dict(json.loads((cm.metadata.annotations or {})[f"{STATS_ANNOTATION}0"]))
