"""The failpoint seam: off and free unless armed; armed points fail, wait or count as the spec says."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fibers import failpoints


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    yield
    failpoints.arm("")


def test_an_unarmed_point_does_nothing() -> None:
    failpoints.arm("")
    failpoints.hit("mongo.write", ConnectionError)
    assert failpoints.fired == {}


def test_a_point_fires_after_its_skips_for_its_count_with_the_boundarys_own_exception() -> None:
    failpoints.arm("mongo.write=2+3*error")
    outcomes = []
    for _ in range(7):
        try:
            failpoints.hit("mongo.write", ConnectionError)
            outcomes.append("ok")
        except ConnectionError as exc:
            assert "failpoint mongo.write" in str(exc)
            outcomes.append("failed")
    assert outcomes == ["ok", "ok", "failed", "failed", "failed", "ok", "ok"]
    assert failpoints.fired == {"mongo.write": 3}


def test_a_sleep_waits_and_goes_on_and_other_points_are_untouched() -> None:
    failpoints.arm("kafka.poll=1*sleep(0.2); checkpoint.write=error")
    started = time.monotonic()
    failpoints.hit("kafka.poll")
    assert time.monotonic() - started >= 0.2
    failpoints.hit("kafka.poll")  # its one firing is spent
    failpoints.hit("lease.renew")
    with pytest.raises(failpoints.FailpointError):
        failpoints.hit("checkpoint.write")  # no count: every hit


@pytest.mark.parametrize("spec", ["mongo.write", "=error", "x=explode", "x=2*", "x=sleep(a)"])
def test_a_spec_that_is_not_one_is_refused_naming_the_part(spec: str) -> None:
    with pytest.raises(ValueError, match="FIBERS_FAILPOINTS"):
        failpoints.parse(spec)
