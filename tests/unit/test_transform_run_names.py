"""A new run is never an old one: the names `runs.plan` gives the runs it starts (pure).

A run's name is made from what starts it (the spec's digest, a rerun or seek nonce, a Secrets digest) so that
a start retried after a crash names the same SparkApplication. A spec, nonce or Secret put back as it was
(A → B → A → B, a GitOps revert and re-apply; rerunNonce a → b → a) named a run kept in history: its create
met the finished app, took it for its own retried submit, and reported its result — Succeeded, its records —
for a run that never happened.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fibers.transform.runs import TransformView, plan, run_name
from fibers.transform.spec import spec_hash

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
A = {"mode": "batch", "inputs": [], "sql": "SELECT 1 AS a"}
B = {**A, "sql": "SELECT 2 AS a"}


def view(spec: dict[str, Any], current: dict[str, Any], **status: Any) -> TransformView:
    meta = {"name": "t", "uid": "U", "creationTimestamp": "2026-11-01T00:00:00Z"}
    return TransformView({"metadata": meta, "spec": spec, "status": {"currentRun": current, **status}})


def completed(name: str, day: int) -> dict[str, Any]:
    meta = {"name": name, "uid": f"{name}-uid", "creationTimestamp": f"2026-11-{day:02d}T00:00:00Z"}
    return {"metadata": meta, "status": {"applicationState": {"state": "COMPLETED"}}}


def test_a_spec_put_back_as_it_was_starts_a_run_of_its_own() -> None:
    first = run_name("t", "U", f"create/{spec_hash(A)}")
    second = run_name("t", "U", f"spec-change/{spec_hash(B)}")
    third = run_name("t", "U", f"spec-change/{spec_hash(A)}")
    kept = [completed(first, 1), completed(second, 2), completed(third, 3)]
    current = {"name": third, "specHash": spec_hash(A), "applicationState": "COMPLETED"}
    start = plan(view(B, current), kept, NOW).start
    assert start is not None and start[1] == "spec-change"
    assert start[0] not in {first, second, third}
    assert plan(view(B, current), kept, NOW).start == start  # the same plan again: one name


def test_a_rerun_nonce_put_back_starts_a_run_of_its_own() -> None:
    spec = {**A, "rerunNonce": "a"}
    earlier = run_name("t", "U", f"rerun/a/{spec_hash(spec)}")
    current = {"name": "t-b", "specHash": spec_hash(spec), "applicationState": "COMPLETED"}
    start = plan(view(spec, current, lastRerunNonce="b"), [completed(earlier, 1)], NOW).start
    assert start is not None and start[1] == "rerun" and start[0] != earlier


def test_a_schedule_slot_already_started_names_its_run_again() -> None:
    """A slot is started once: its run found under its name is that start (retried), not an old run."""
    spec = {**A, "schedule": "0 * * * *"}
    slot = run_name("t", "U", "schedule/2026-12-01T11:00:00Z")
    current = {"name": slot, "specHash": spec_hash(spec)}
    start = plan(view(spec, current, lastScheduleTime="2026-12-01T10:00:00Z"), [completed(slot, 1)], NOW).start
    assert start == (slot, "schedule")
