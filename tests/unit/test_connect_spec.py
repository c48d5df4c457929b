"""parse() of a Connect spec, the config Kafka Connect is given, and the auto-restart backoff."""

from __future__ import annotations

from typing import Any

import pytest

from fibers.connect.spec import AutoRestartPolicy, SecretRef, SpecError, parse

CLUSTER = "connect-a"


def _spec(**fields: Any) -> dict[str, Any]:
    return {"cluster": CLUSTER, "class": "FileStreamSource", **fields}


def test_defaults() -> None:
    spec = parse(_spec(), "orders")
    assert spec.cluster == CLUSTER
    assert spec.connector == "orders"
    assert spec.connector_class == "FileStreamSource"
    assert spec.tasks_max == 1
    assert spec.state == "running"
    assert spec.connect_state == "RUNNING"
    assert spec.config == {}
    assert spec.secret_refs == {}
    assert spec.restart_nonce is None
    assert spec.auto_restart == AutoRestartPolicy(
        enabled=True, max_restarts=None, backoff_seconds=60, max_backoff_seconds=1800, reset_after_seconds=600
    )


def test_explicit_fields_override_defaults() -> None:
    spec = parse(
        _spec(
            connectorName="orders-src",
            tasksMax=3,
            state="paused",
            restartNonce="n1",
            secretConfig={"database.password": {"secretKeyRef": {"name": "db", "key": "password"}}},
            autoRestart={
                "enabled": False,
                "maxRestarts": 4,
                "backoffSeconds": 5,
                "maxBackoffSeconds": 50,
                "resetAfterSeconds": 30,
            },
        ),
        "orders",
    )
    assert spec.connector == "orders-src"
    assert spec.tasks_max == 3
    assert spec.state == "paused"
    assert spec.connect_state == "PAUSED"
    assert spec.restart_nonce == "n1"
    assert spec.secret_refs == {"database.password": SecretRef("db", "password")}
    assert spec.auto_restart == AutoRestartPolicy(
        enabled=False, max_restarts=4, backoff_seconds=5, max_backoff_seconds=50, reset_after_seconds=30
    )


def test_empty_restart_nonce_is_none() -> None:
    assert parse(_spec(restartNonce=""), "orders").restart_nonce is None


def test_config_values_are_rendered_as_kafka_connect_strings() -> None:
    spec = parse(
        _spec(config={"poll.ms": 5, "enabled": True, "skip": False, "ratio": 0.5, "topic": "orders"}), "orders"
    )
    assert spec.config == {"poll.ms": "5", "enabled": "true", "skip": "false", "ratio": "0.5", "topic": "orders"}


@pytest.mark.parametrize("value", [{"nested": "x"}, ["a", "b"], None])
def test_non_scalar_config_value_is_rejected_naming_the_key(value: Any) -> None:
    with pytest.raises(SpecError, match=r"spec\.config\.transforms\.route"):
        parse(_spec(config={"topic": "ok", "transforms.route": value}), "orders")


def test_cluster_is_a_name_or_none() -> None:
    assert parse({"class": "FileStreamSource"}, "orders").cluster is None
    assert parse(_spec(), "orders").cluster == CLUSTER


def test_full_config_has_owned_fields_and_secret_values() -> None:
    spec = parse(_spec(connectorName="orders-src", tasksMax=2, config={"topic": "orders"}), "orders")
    assert spec.full_config({"database.password": "s3cr3t"}, "shop/orders") == {
        "topic": "orders",
        "database.password": "s3cr3t",
        "name": "orders-src",
        "connector.class": "FileStreamSource",
        "tasks.max": "2",
        "fibers.owner": "shop/orders",
    }


def test_full_config_owned_fields_win_over_user_config() -> None:
    spec = parse(_spec(config={"name": "other", "tasks.max": 9}), "orders")
    full = spec.full_config({}, "shop/orders")
    assert full["name"] == "orders"
    assert full["tasks.max"] == "1"


def test_backoff_delay_grows_and_is_capped() -> None:
    policy = AutoRestartPolicy(backoff_seconds=10, max_backoff_seconds=100)
    assert [policy.delay(n) for n in range(5)] == [0, 20, 60, 100, 100]
    default = AutoRestartPolicy()
    assert [default.delay(n) for n in range(4)] == [0, 120, 360, 720]
    assert default.delay(10) == 1800


def test_exhausted() -> None:
    assert not AutoRestartPolicy().exhausted(1000)
    limited = AutoRestartPolicy(max_restarts=3)
    assert not limited.exhausted(2)
    assert limited.exhausted(3)
    assert limited.exhausted(4)
    assert AutoRestartPolicy(max_restarts=0).exhausted(0)


@pytest.mark.parametrize("field", ["config", "secretConfig"])
def test_the_owner_key_cannot_be_set_by_the_spec(field: str) -> None:
    value: Any = {"secretKeyRef": {"name": "s", "key": "k"}} if field == "secretConfig" else "team-a/orders"
    with pytest.raises(SpecError, match=rf"spec\.{field}\.fibers\.owner"):
        parse(_spec(**{field: {"fibers.owner": value}}), "orders")


@pytest.mark.parametrize("field", ["config", "secretConfig"])
def test_a_sink_cannot_name_its_consumer_group(field: str) -> None:
    """Named by the user, the group could be another team's: the connector would read its records, and a seek or a
    Replay would move that team's offsets (Kafka Connect moves the group the connector uses)."""
    value: Any = {"secretKeyRef": {"name": "s", "key": "k"}} if field == "secretConfig" else "connect-b-sink"
    with pytest.raises(SpecError, match=rf"spec\.{field}\.consumer\.override\.group\.id"):
        parse(_spec(**{field: {"consumer.override.group.id": value}}), "orders")


@pytest.mark.parametrize(
    "value",
    ["${file:/etc/kafka/team-b.properties:password}", "jdbc:x?p=${directory:/mnt/team-b:password}", "${env:X}"],
)
def test_a_config_value_asking_kafka_connects_config_providers_is_refused(value: str) -> None:
    """Kafka Connect replaces `${provider:[path:]key}` with what a provider set up on its workers reads (a
    worker's file or directory, its environment, Secrets the workers may read): none of them the namespace's.
    A connector config may not ask for one, from `config`, its class or a Secret's value. The spec still
    parses: its resource stays the owner of the connector it may have made before (a deletion deletes it)."""
    with pytest.raises(SpecError, match=r"spec\.config\.database\.password: .*config provider"):
        parse(_spec(config={"database.password": value}), "orders").full_config({}, "shop/orders")
    with pytest.raises(SpecError, match=r"spec\.class: .*config provider"):
        parse(_spec(**{"class": value}), "orders").full_config({}, "shop/orders")
    spec = parse(_spec(secretConfig={"database.password": {"secretKeyRef": {"name": "db", "key": "p"}}}), "orders")
    with pytest.raises(SpecError, match=r"spec\.secretConfig\.database\.password: .*config provider"):
        spec.full_config({"database.password": value}, "shop/orders")


def test_dollars_and_braces_that_ask_no_provider_are_kept() -> None:
    config = {"transforms.route.replacement": "$1", "query": "{a}", "regex": "${name}", "price": "$5:{x}"}
    assert parse(_spec(config=config), "orders").full_config({}, "shop/orders").items() >= config.items()


def test_a_secret_value_refused_is_not_quoted() -> None:
    spec = parse(_spec(secretConfig={"database.password": {"secretKeyRef": {"name": "db", "key": "p"}}}), "orders")
    with pytest.raises(SpecError) as refused:
        spec.full_config({"database.password": "s3cr3t${file:/x:y}"}, "shop/orders")
    assert "s3cr3t" not in str(refused.value) and "file:" not in str(refused.value)
