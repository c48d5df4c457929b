"""Kafka Connect's validate answers turned into messages naming spec fields; unknown classes (pure)."""

from __future__ import annotations

from typing import Any

from fibers.connect.spec import parse
from fibers.connect.validation import describe, errors, unknown_class

SPEC = parse(
    {
        "class": "io.debezium.connector.postgresql.PostgresConnector",
        "config": {"plugin.name": "nope"},
        "secretConfig": {"database.password": {"secretKeyRef": {"name": "db", "key": "password"}}},
    },
    "orders",
)


def _entry(name: str, *errs: str) -> dict[str, Any]:
    return {"definition": {"name": name}, "value": {"name": name, "value": None, "errors": list(errs)}}


def test_errors_name_the_spec_field_each_key_comes_from() -> None:
    result = {
        "error_count": 4,
        "configs": [
            _entry("database.hostname", 'Missing required configuration "database.hostname"'),
            _entry("plugin.name", "Invalid value nope"),
            _entry("database.password", "Access denied for hunter2"),
            _entry("tasks.max", "must be 1"),
            _entry("topic.prefix"),  # fine: no error
        ],
    }
    found = errors(result, SPEC)
    assert found == [
        'spec.config.database.hostname: Missing required configuration "database.hostname"',
        "spec.config.plugin.name: Invalid value nope",
        "spec.secretConfig.database.password: Access denied for hunter2",
        "spec.tasksMax: must be 1",
    ]
    message = describe(found, ("hunter2",))
    assert message.startswith("Kafka Connect rejects the config (4 errors): ")
    assert "hunter2" not in message and "***" in message


def test_no_errors() -> None:
    assert errors({"error_count": 0, "configs": [_entry("plugin.name")]}, SPEC) == []


PLUGINS = [
    {"class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "type": "source", "version": "4.1.1"},
    {"class": "io.debezium.connector.postgresql.PostgresConnector", "type": "source", "version": "3.3.2.Final"},
]


def test_known_class_by_any_name_connect_accepts() -> None:
    for name in (
        "org.apache.kafka.connect.file.FileStreamSourceConnector",
        "FileStreamSourceConnector",
        "FileStreamSource",
    ):
        assert unknown_class(name, PLUGINS, "c") is None


def test_unknown_class_lists_what_the_cluster_has() -> None:
    message = unknown_class("com.example.Nope", PLUGINS, "prod")
    assert message == (
        "spec.class: com.example.Nope is not installed on ConnectCluster prod; it has: "
        "io.debezium.connector.postgresql.PostgresConnector, org.apache.kafka.connect.file.FileStreamSourceConnector"
    )


def test_without_a_plugin_list_connect_is_asked() -> None:
    assert unknown_class("com.example.Nope", [], "prod") is None
