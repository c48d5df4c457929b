from __future__ import annotations

import json
import logging

from fibers.logs import JsonFormatter, TextFormatter


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


def test_text_lines_append_fields() -> None:
    line = TextFormatter().format(_record(namespace="ns1"))
    assert line.endswith("W connector orders failed  namespace=ns1")
