"""A consumer's `callback: package.module:Class` sink (no servers).

The class was constructed with the sink's options before it was checked to be a Callback: any class the
image holds could be named, and `subprocess:Popen` with `options: {args: [sh, -c, …]}` ran a command of the
spec's in the consumer pod, with only the job image the platform allows (`policy.allowedImages`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fibers.consumer import callbacks

BUILT: list[dict[str, Any]] = []


class NotACallback:
    def __init__(self, **options: Any) -> None:
        BUILT.append(options)


class Counting(callbacks.Callback):
    def __init__(self, **options: Any) -> None:
        BUILT.append(options)


def test_a_class_that_is_not_a_callback_is_refused_before_it_is_built(tmp_path: Path) -> None:
    BUILT.clear()
    with pytest.raises(TypeError, match="must subclass"):
        callbacks.load(f"{__name__}:NotACallback", {"args": ["sh", "-c", "true"]})
    ran = tmp_path / "ran"
    with pytest.raises(TypeError, match="must subclass"):
        callbacks.load("subprocess:Popen", {"args": ["sh", "-c", f"touch {ran}"]})
    time.sleep(0.2)  # a command started would have touched it by now
    assert BUILT == [] and not ran.exists()


def test_a_callback_class_is_built_with_the_options() -> None:
    BUILT.clear()
    assert isinstance(callbacks.load(f"{__name__}:Counting", {"a": 1}), Counting)
    assert BUILT == [{"a": 1}]
