"""`fibers-stack fetch`: what it builds by default, and the lines a person waiting on it reads."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from fibers_stack import fetch


def test_argo_cd_is_built_only_when_asked_for_and_each_component_says_how_long(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    called: list[str] = []
    fake = {name: (lambda name=name: called.append(name)) for name in ("kubernetes", "argocd", "kafka")}
    monkeypatch.setattr(fetch, "COMPONENTS", fake)
    with caplog.at_level(logging.INFO, logger="fibers_stack.fetch"):
        fetch.fetch_all()
    assert called == ["kubernetes", "kafka"]  # the demo and `up` never wait for Argo CD
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "[1/2] kubernetes: checking the cache (a cold build takes about 4.5 min)"
    assert lines[1].startswith("[1/2] kubernetes: ready after ") and lines[1].endswith(" s")
    assert lines[2] == "[2/2] kafka: checking the cache"
    assert lines[-1].startswith("all 2 components ready after ")
    fetch.fetch_all(["argocd"])
    assert called[-1] == "argocd"


def test_the_stack_command_prints_lines_not_json_when_piped() -> None:
    """Piped to tee (not a terminal), as a cold `make demo | tee` is: still lines a person reads."""
    result = subprocess.run(
        [sys.executable, "-m", "fibers_stack.cli", "fetch", "kafka"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "[1/1] kafka: ready after" in result.stderr and not result.stderr.lstrip().startswith("{")
