"""Logging setup shared by the CLI, the operator and the consumer runtime.

Human-readable lines on a terminal, one JSON object per line otherwise (what log collectors want).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

import pythonjsonlogger.core
import pythonjsonlogger.json

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


_HIDDEN = {"settings", "k8s_skip"}  # kopf attaches these to every record; they are noise


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    extras = {k: v for k, v in vars(record).items() if k not in _RESERVED | _HIDDEN and not k.startswith("_")}
    ref = extras.pop("k8s_ref", None)
    if isinstance(ref, dict):  # kopf's per-object loggers
        extras.setdefault("namespace", ref.get("namespace"))
        extras.setdefault("resource", f"{ref.get('kind')}/{ref.get('name')}")
    return extras


class JsonFormatter(pythonjsonlogger.json.JsonFormatter):
    """One JSON object per line, through python-json-logger (kopf's own dependency): time, level, logger and
    message first, then the record's structured fields (`extra=`), kopf's object reference as namespace
    and resource."""

    def __init__(self) -> None:
        super().__init__(
            "%(message)s",
            reserved_attrs=[*pythonjsonlogger.core.RESERVED_ATTRS, *_HIDDEN],
            rename_fields={"exc_info": "exception"},
            json_default=str,
        )

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_record["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        log_record["level"] = record.levelname.lower()
        log_record["logger"] = record.name
        super().add_fields(log_record, record, message_dict)
        ref = log_record.pop("k8s_ref", None)
        if isinstance(ref, dict):  # kopf's per-object loggers
            log_record.setdefault("namespace", ref.get("namespace"))
            log_record.setdefault("resource", f"{ref.get('kind')}/{ref.get('name')}")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname[0]} {record.getMessage()}"
        return f"{line}  {extras}" if extras else line


class WatchHandlerSuccess(logging.Filter):
    """Drops kopf's "Handler 'x' succeeded." for handlers that run on every watch event.

    kopf logs that line at INFO after each handler call. For a handler of every watch event it is one
    line per event that says nothing: 1,000 new Connects made 7,000 of them, and formatting them was
    a visible share of the operator's CPU during the wave. Failures are still logged.
    """

    def __init__(self, handlers: set[str]) -> None:
        super().__init__()
        self._lines = {f"Handler {name!r} succeeded." for name in handlers}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in self._lines)


class Repeats:
    """Which lines of a repeated failure to log: the first, each change, then one every `every` seconds.

    A failure retried every few seconds (an API server or Kafka Connect that does not answer, a CRD
    that is not installed) would otherwise log a line per try, and per resource.
    """

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: dict[Hashable, tuple[str, float]] = {}  # key -> (message, when it was last logged)

    def due(self, key: Hashable, message: str) -> bool:
        """True when this failure should be logged now (and then it counts as logged)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and last[0] == message and now - last[1] < self.every:
            return False
        self._last[key] = (message, now)
        return True

    def ended(self, key: Hashable) -> bool:
        """The failure is over: True when it had been logged (so its end is worth a line too)."""
        return self._last.pop(key, None) is not None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._last


def setup(level: int = logging.INFO, json_lines: bool | None = None) -> None:
    """Configure the root logger once; JSON when stderr is not a terminal unless told otherwise."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Request lines from HTTP clients are noise at INFO (and may carry URLs we do not want logged).
    for noisy in ("httpx", "httpcore", "kubernetes.client.rest", "urllib3"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
