from __future__ import annotations

import json
import logging
import sys

import kopf

from fibers import controller
from fibers.logs import JsonFormatter, TextFormatter, WatchHandlerSuccess


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("fibers.test", logging.WARNING, __file__, 1, "connector %s failed", ("orders",), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_message_and_structured_fields() -> None:
    entry = json.loads(JsonFormatter().format(_record(namespace="ns1", resource="orders")))
    assert entry["message"] == "connector orders failed"
    assert entry["level"] == "warning"
    assert entry["namespace"] == "ns1"
    assert entry["resource"] == "orders"
    assert list(entry)[:4] == ["time", "level", "logger", "message"]


def test_kopfs_object_reference_becomes_namespace_and_resource_and_its_settings_are_hidden() -> None:
    ref = {"namespace": "shop", "kind": "Connect", "name": "orders-cdc"}
    entry = json.loads(JsonFormatter().format(_record(k8s_ref=ref, settings=object(), _private=1)))
    assert entry["namespace"] == "shop" and entry["resource"] == "Connect/orders-cdc"
    assert not {"k8s_ref", "settings", "_private"} & set(entry)


def test_an_exception_is_one_field_of_the_line() -> None:
    try:
        raise ValueError("no such connector")
    except ValueError:
        record = logging.LogRecord("fibers.test", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exception"].startswith("Traceback") and "ValueError: no such connector" in entry["exception"]


def test_text_lines_append_fields() -> None:
    line = TextFormatter().format(_record(namespace="ns1"))
    assert line.endswith("W connector orders failed  namespace=ns1")


def test_kopfs_success_line_is_dropped_for_every_watch_handler_and_only_for_those() -> None:
    """One INFO line per watch event says nothing: 1,000 new Connects made 7,000 of them."""
    watching = {h.id for h in kopf.get_default_registry()._watching.get_all_handlers()}
    assert watching == controller.WATCH_HANDLERS  # a new watch handler is not forgotten here
    quiet = WatchHandlerSuccess(controller.WATCH_HANDLERS)

    def kept(level: int, message: str) -> bool:
        return quiet.filter(logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None))

    assert not kept(logging.INFO, "Handler 'connect_event' succeeded.")
    assert kept(logging.INFO, "Handler 'consumer_deleted' succeeded.")  # a change handler's: kept
    assert kept(logging.ERROR, "Handler 'connect_event' failed with an exception and will try again in 60 seconds")
