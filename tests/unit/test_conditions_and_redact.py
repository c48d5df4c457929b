"""conditions.merge, redact/truncate and kube.merge_patch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from fibers import conditions
from fibers.conditions import READY, RECONCILING, Condition, format_time, parse_time
from fibers.kube import merge_patch
from fibers.redact import MASK, redact, truncate

EARLIER = "2025-03-01T11:00:00Z"
NOW = "2025-03-01T12:00:00Z"


def _previous() -> list[dict[str, object]]:
    return conditions.merge(
        None,
        [Condition(READY, True, "Running", "connector is RUNNING"), Condition(RECONCILING, False, "Running")],
        3,
        EARLIER,
    )


def test_merge_renders_conditions_with_generation() -> None:
    rendered = conditions.merge(None, [Condition(READY, False, "Creating", "creating connector orders")], 7, NOW)
    assert rendered == [
        {
            "type": READY,
            "status": "False",
            "reason": "Creating",
            "message": "creating connector orders",
            "lastTransitionTime": NOW,
            "observedGeneration": 7,
        }
    ]


def test_merge_keeps_transition_time_when_status_unchanged() -> None:
    rendered = conditions.merge(
        _previous(), [Condition(READY, True, "Rebalanced", "tasks are being reassigned")], 4, NOW
    )
    ready = conditions.find(rendered, READY)
    assert ready is not None
    assert ready["lastTransitionTime"] == EARLIER
    assert ready["reason"] == "Rebalanced"
    assert ready["message"] == "tasks are being reassigned"
    assert ready["observedGeneration"] == 4


def test_merge_moves_transition_time_when_status_flips() -> None:
    rendered = conditions.merge(
        _previous(),
        [Condition(READY, False, "TasksFailed", "task 0 FAILED"), Condition(RECONCILING, True, "AutoRestarting")],
        3,
        NOW,
    )
    ready, reconciling = conditions.find(rendered, READY), conditions.find(rendered, RECONCILING)
    assert ready is not None and reconciling is not None
    assert (ready["status"], ready["lastTransitionTime"]) == ("False", NOW)
    assert (reconciling["status"], reconciling["lastTransitionTime"]) == ("True", NOW)


def test_merge_new_condition_type_gets_now() -> None:
    rendered = conditions.merge(_previous(), [Condition("Stalled", False, "Running")], 3, NOW)
    assert rendered[0]["lastTransitionTime"] == NOW
    assert [c["type"] for c in rendered] == ["Stalled"]


def test_merge_previous_without_transition_time_gets_now() -> None:
    previous: list[dict[str, object]] = [{"type": READY, "status": "True"}]
    rendered = conditions.merge(previous, [Condition(READY, True, "Running")], 1, NOW)
    assert rendered[0]["lastTransitionTime"] == NOW


def test_is_true_and_find() -> None:
    previous = _previous()
    assert conditions.is_true(previous, READY)
    assert not conditions.is_true(previous, RECONCILING)
    assert not conditions.is_true(previous, "Stalled")
    assert not conditions.is_true(None, READY)
    assert conditions.find(previous, "Stalled") is None


def test_time_round_trip_is_utc_second_precision() -> None:
    moment = datetime(2025, 3, 1, 13, 30, 15, 999_999, tzinfo=UTC)
    assert format_time(moment) == "2025-03-01T13:30:15Z"
    assert format_time(moment.astimezone(timezone(timedelta(hours=2)))) == "2025-03-01T13:30:15Z"
    assert parse_time("2025-03-01T13:30:15Z") == moment.replace(microsecond=0)
    assert conditions.utcnow().tzinfo is UTC


def test_redact_hides_secret_values() -> None:
    assert redact("login with hunter2 failed (hunter2)", ["hunter2"]) == f"login with {MASK} failed ({MASK})"


def test_redact_hides_longest_secret_first() -> None:
    # If "abc" went first, "abcdef" would leak as "***def".
    assert redact("token=abcdef key=abc", ["abc", "abcdef"]) == "token=*** key=***"


def test_redact_ignores_empty_secrets() -> None:
    assert redact("nothing secret", ["", "absent"]) == "nothing secret"


def test_redact_hides_url_credentials() -> None:
    text = "cannot reach http://admin:s3cret@connect:8083/connectors and mongodb://u:p@db:27017/x"
    assert redact(text, []) == "cannot reach http://***@connect:8083/connectors and mongodb://***@db:27017/x"


def test_redact_leaves_urls_without_credentials() -> None:
    text = "GET http://connect:8083/connectors?expand=status (user@example.com)"
    assert redact(text, []) == text


def test_truncate() -> None:
    assert truncate("short", 10) == "short"
    assert truncate("x" * 10, 10) == "x" * 10
    cut = truncate("abcdefghijkl", 10)
    assert cut == "abcdefghi…"
    assert len(cut) == 10
    assert len(truncate("y" * 5000)) == 1024


def test_merge_patch_removed_keys_become_none() -> None:
    assert merge_patch({"a": 1, "b": 2}, {"a": 1}) == {"a": 1, "b": None}


def test_merge_patch_recurses_into_nested_dicts() -> None:
    old = {"status": {"phase": "Running", "workerId": "w1", "autoRestart": {"count": 2, "lastRestartTime": "t"}}}
    new = {"status": {"phase": "Failed", "autoRestart": {"count": 0}}}
    assert merge_patch(old, new) == {
        "status": {"phase": "Failed", "workerId": None, "autoRestart": {"count": 0, "lastRestartTime": None}}
    }


def test_merge_patch_replaces_lists() -> None:
    old = {"tasks": [{"id": 0, "state": "RUNNING"}, {"id": 1, "state": "RUNNING"}]}
    new = {"tasks": [{"id": 0, "state": "FAILED"}]}
    assert merge_patch(old, new) == {"tasks": [{"id": 0, "state": "FAILED"}]}


def test_merge_patch_new_keys_and_type_changes() -> None:
    assert merge_patch({"a": "x"}, {"a": {"b": 1}, "c": [1]}) == {"a": {"b": 1}, "c": [1]}
    assert merge_patch({"a": {"b": 1}}, {"a": "x"}) == {"a": "x"}


def test_paused_is_the_annotation_true_and_says_so_on_reconciling_only() -> None:
    from fibers.conditions import PAUSED, paused, ready, with_paused

    assert paused({"annotations": {"fibers.dev/paused-reconciliation": "true"}})
    assert not paused({"annotations": {"fibers.dev/paused-reconciliation": "false"}}) and not paused({})
    conds = with_paused(ready("Registered", "v1"))
    assert [c.type for c in conds] == ["Ready", "Reconciling", "Stalled"]
    assert conds[1] == PAUSED and conds[0].status is True and conds[0].reason == "Registered"
