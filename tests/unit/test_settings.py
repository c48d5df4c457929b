"""The operator's settings: every variable the chart sets is one the operator reads, and the other way round."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fibers.settings import Settings

CHART = Path(__file__).parents[2] / "charts/fibers/templates/deployment.yaml"
# Read by the operator but not set by the chart: set by `fibers run` itself (-n), or knobs for tests and benchmarks.
NOT_FROM_THE_CHART = {"FIBERS_NAMESPACES", "FIBERS_CONNECT_FAST_INTERVAL", "FIBERS_API_THREADS"}


class Recording(dict[str, str]):
    """An environment that remembers which variables were asked for."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)


def test_every_variable_the_chart_sets_is_read_and_every_one_read_is_the_charts() -> None:
    env = Recording()
    Settings.from_env(env)
    chart = set(re.findall(r"- name: (FIBERS_[A-Z_]+)", CHART.read_text()))
    assert chart - env.asked == set(), "set by the chart, read by nobody"
    assert env.asked - chart == NOT_FROM_THE_CHART, "read, but no chart value sets it"


def test_a_value_that_is_not_a_number_names_its_variable() -> None:
    with pytest.raises(ValueError, match="FIBERS_CONNECT_SYNC_INTERVAL"):
        Settings.from_env({"FIBERS_CONNECT_SYNC_INTERVAL": "ten"})
    with pytest.raises(ValueError, match="FIBERS_RECONCILE_WORKERS"):
        Settings.from_env({"FIBERS_RECONCILE_WORKERS": "4.5"})
    settings = Settings.from_env({"FIBERS_NAMESPACES": "a,b", "FIBERS_CONNECT_SYNC_INTERVAL": "3"})
    assert settings.namespaces == ("a", "b") and settings.connect.interval == 3.0
