"""What passes admission but cannot run: the reason, naming the field, before anything is created; and the
outages that are not the spec's fault: a one-line retry."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import pytest

from fibers import outages, termination
from fibers.databus.config import ConfigError, ConsumerConfig
from fibers.kubeapi import ApiError, Unreachable
from fibers.transform.report import report
from fibers.transform.runs import TransformView
from fibers.transform.spec import Defaults, problem

DEFAULTS = Defaults(kafka_bootstrap="kafka:9092")
BATCH: dict[str, Any] = {
    "inputs": [{"name": "orders", "kafka": {"topics": ["orders"]}}],
    "sql": "SELECT * FROM orders",
    "output": {"files": {"path": "/data/out", "format": "parquet"}},
}


def check(**spec: Any) -> str:
    return problem({**BATCH, **spec}, name="t", namespace="ns", defaults=DEFAULTS)


def test_a_runnable_spec_has_no_problem() -> None:
    assert check() == ""
    assert check(schedule="*/5 * * * *") == ""
    assert check(schedule="@daily") == ""
    connect = {"inputs": [{"name": "orders", "connectRef": {"name": "pg", "avro": {}}}]}
    assert check(**connect) == ""  # what the Connect and the registry supply is not this check's business


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ("61 * * * *", "out of range"),
        ("*/0 * * * *", "step"),
        ("0 0 * * 8", "out of range"),
        ("0 0 30 2 *", "failed to find"),  # parses, but February has no 30th: it would never run
    ],
)
def test_a_schedule_cron_cannot_use_is_named(schedule: str, words: str) -> None:
    message = check(schedule=schedule)
    assert message.startswith(f"spec.schedule: {schedule!r} is not a usable cron expression")
    assert words in message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {
                "mode": "streaming",
                "checkpoint": {"location": "/c"},
                "output": {"mongodb": {"uriSecretRef": {"name": "m", "key": "u"}, "database": "d", "collection": "c"}},
            },
            "spec.output.mongodb",
        ),
        ({"mode": "streaming", "output": {"kafka": {"topic": "t"}}}, "spec.checkpoint.location"),
        ({"inputs": [{"name": "a", "kafka": {"topics": ["x"]}}, {"name": "A", "kafka": {"topics": ["y"]}}]}, "named"),
        ({"inputs": [{"name": "bad-name", "kafka": {"topics": ["x"]}}]}, "spec.inputs[0].name"),
    ],
)
def test_what_the_driver_would_refuse_is_named_by_the_operator(spec: dict[str, Any], field: str) -> None:
    assert field in check(**spec)


def test_an_entrypoint_without_a_function_is_named() -> None:
    spec = {k: v for k, v in BATCH.items() if k != "sql"}
    message = problem({**spec, "entrypoint": "nocolon"}, name="t", namespace="ns", defaults=DEFAULTS)
    assert message.startswith("spec.entrypoint must look like package.module:function")


def test_no_default_kafka_is_a_problem_of_the_spec() -> None:
    message = problem(BATCH, name="t", namespace="ns", defaults=Defaults())
    assert "spec.kafka.bootstrapServers" in message


def test_an_invalid_spec_is_stalled_whatever_the_last_run_did() -> None:
    body = {
        "metadata": {
            "name": "t",
            "namespace": "ns",
            "uid": "u",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {**BATCH, "schedule": "61 * * * *"},
        "status": {},
    }
    status = report(
        TransformView(body),
        {"name": "r", "applicationState": "COMPLETED"},
        datetime.now(UTC),
        invalid="spec.schedule: x",
    )
    ready = {c["type"]: c for c in status["conditions"]}
    assert (ready["Ready"]["status"], ready["Ready"]["reason"], ready["Stalled"]["status"]) == (
        "False",
        "InvalidSpec",
        "True",
    )
    assert ready["Ready"]["message"] == "spec.schedule: x"
    assert status["phase"] == "Failed"


def consumer(**changes: Any) -> ConsumerConfig:
    data: dict[str, Any] = {
        "name": "c",
        "namespace": "ns",
        "relay": {"topics": ["pg.public.orders"], "bootstrapServers": "kafka:9092,other:9093"},
        "sink": {"type": "mongodb", "uriEnv": "X", "database": "shop", "collection": "orders"},
        "checkpoint": {"configMapName": "c-checkpoint"},
        "startPosition": "earliest",
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section] = {**data[section], field: value}
        else:
            data[section] = value
    return ConsumerConfig.from_dict(data)


def test_a_runnable_consumer_passes() -> None:
    assert consumer().check().topics == ["pg.public.orders"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"relay__topics": ["t", "t"]}, "spec.sources must be distinct"),
        ({"relay__topics": []}, "spec.sources"),
        ({"relay__topics": [".."]}, "spec.sources"),
        ({"relay__topics": ["x" * 250]}, "spec.sources"),
        ({"relay__topics": ["caf\u00e9"]}, "spec.sources"),
        ({"relay__bootstrapServers": "kafka"}, "spec.relay.bootstrapServers"),
        ({"checkpoint__configMapName": "Bad_Name!"}, "spec.checkpoint.configMapName"),
        ({"checkpoint__minIntervalSeconds": -1}, "spec.checkpoint.minIntervalSeconds"),
        ({"sink__database": "a.b"}, "spec.sink.database"),
        ({"sink__database": "x" * 64}, "spec.sink.database"),
        ({"sink__collection": "system.users"}, "spec.sink.collection"),
        ({"sink__collection": "a$b"}, "spec.sink.collection"),
        ({"sink": {"type": "kafka", "topic": "no spaces"}}, "spec.sink.topic"),
        ({"sink": {"type": "callback", "callback": "nocolon"}}, "spec.sink.callback"),
        ({"sink": {"type": "smoke"}}, "spec.sink.type"),
        ({"startPosition": "bootstrap"}, "spec.startPosition bootstrap needs spec.bootstrap"),
        ({"startPosition": "yesterday"}, "spec.startPosition"),
        ({"callback": {"timeoutSeconds": 0}}, "spec.callbackPolicy.timeoutSeconds"),
        ({"callback": {"retries": -2}}, "spec.callbackPolicy.retries"),
        ({"instances": 0}, "spec.instances"),
    ],
)
def test_a_consumer_that_cannot_run_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        consumer(**changes).check()
    assert field in str(caught.value)


def test_the_termination_message_is_redacted_and_kept_within_the_kubelets_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(termination.PATH_ENV, str(path))
    termination.write("cannot reach mongodb://fibers:s3cr3t@db:27017/x with token tok-123", ["tok-123"])
    assert path.read_text() == "cannot reach mongodb://***@db:27017/x with token ***"
    termination.write("é" * 5000)
    written = path.read_bytes()
    assert len(written) <= termination.LIMIT
    assert written.decode().endswith("…")


def test_without_a_termination_log_nothing_is_raised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "missing-dir" / "log"))
    termination.write("still fine")


@pytest.mark.parametrize(
    "error",
    [
        Unreachable("ConnectError: [Errno 111] Connection refused"),
        Unreachable("RemoteProtocolError: Server disconnected without sending a response."),
        ApiError(503, "Service Unavailable"),
        ApiError(429, "Too Many Requests"),
    ],
)
def test_an_api_server_outage_is_a_one_line_retry_not_a_traceback(error: Exception) -> None:
    with pytest.raises(kopf.TemporaryError) as caught, outages.api_outage_is_temporary(delay=3):
        raise error
    assert caught.value.delay == 3
    assert "Kubernetes API server" in str(caught.value)


def test_an_api_server_asking_to_wait_is_retried_when_it_said() -> None:
    with pytest.raises(kopf.TemporaryError) as caught, outages.api_outage_is_temporary(delay=3):
        raise ApiError(429, "Too Many Requests", retry_after=7.0)
    assert caught.value.delay == 7.0


def test_other_api_errors_stay_what_they_are() -> None:
    with pytest.raises(ApiError), outages.api_outage_is_temporary():
        raise ApiError(404, "Not Found")
