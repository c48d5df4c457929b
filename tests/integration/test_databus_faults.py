"""The consumer's fault matrix, small: every I/O boundary of a consumer pod fails, hangs or dies once
(bench/consumer_faults.py's SUITE) while it talks to the real Kafka, MongoDB and API server, and the
sink still equals the source, no SCN goes back, no checkpoint runs ahead of its sink, and only a kill
ends a container. The benchmark runs the whole matrix with more records.
"""

from __future__ import annotations

import pytest
from kubernetes.client import ApiClient

from bench.consumer_faults import SUITE, Case, Harness, verdict
from fibers_stack import StackInfo

pytestmark = pytest.mark.databus

RECORDS = 200


@pytest.mark.parametrize("case", SUITE, ids=[case.name for case in SUITE])
def test_a_fault_at_each_boundary_loses_nothing(
    case: Case, stack_info: StackInfo, kube: ApiClient, namespace: str
) -> None:
    harness = Harness(stack_info, kube, namespace)
    try:
        outcome = harness.run(case, RECORDS, seed=7)
    finally:
        harness.close()
    assert verdict(case, outcome) == [], outcome.log_tail
    assert outcome.exits[-1] == 0  # the last pod's consumer ended on SIGTERM, cleanly
