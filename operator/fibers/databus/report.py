"""A DatabusConsumer's status, decided from what its reconcile read (pure): its checkpoints mirrored
(mode, SCNs, timelines), the conditions and the phase."""

from __future__ import annotations

from typing import Any

from fibers import conditions
from fibers.conditions import Condition
from fibers.databus.timelines import STOPPED_ANNOTATION, Checkpoints, progressed
from fibers.redact import redact, truncate

MODE_ORDER = ["INIT", "BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION"]


def mirror_checkpoints(status: dict[str, Any], checkpoints: Checkpoints) -> None:
    """The earliest mode and SCNs over the timelines (INIT ones tell nothing yet), and how many there are."""
    progress = progressed(checkpoints.values())
    if progress:  # INIT alone: nothing consumed yet
        status["consumptionMode"] = min((cp.consumption_mode.value for cp in progress), key=MODE_ORDER.index)
        status["windowScn"] = min(cp.window_scn for cp in progress)
        status["prevScn"] = min(cp.prev_scn for cp in progress)
    if len(checkpoints):
        status["timelines"] = len(checkpoints)


def stopped_instances(annotations: dict[str, str], instances: int) -> tuple[int, str]:
    """Why an instance stopped for good and waits to be replaced (the first current one) and its ordinal,
    or (-1, "").

    A consumer pod that cannot go on says so on its checkpoint ConfigMap and waits, rather than exit and
    be restarted into the same failure (a crash loop); the pods that replace it clear it when they start.
    """
    for key, value in sorted(annotations.items()):
        ordinal = key.removeprefix(STOPPED_ANNOTATION)
        if key.startswith(STOPPED_ANNOTATION) and ordinal.isdigit() and int(ordinal) < instances and value:
            return int(ordinal), truncate(redact(value, ()))
    return -1, ""


def which_instance(ordinal: int, instances: int) -> str:
    """How Ready names a failing instance: "instance 2 of 3 (pod ordinal 1)", or "an instance" when not known."""
    if ordinal < 0:
        return "an instance"
    return f"instance {ordinal + 1} of {instances} (pod ordinal {ordinal})"


def stopped(spec: dict[str, Any]) -> bool:
    """No instance is to run: `suspended` (the word every kind shares) or its older alias `stopped`."""
    return spec.get("state") in ("stopped", "suspended")


def decide(
    spec: dict[str, Any],
    status: dict[str, Any],
    problem: str,
    invalid: str,
    failure: str,
    waiting: str,
    *,
    halted: bool = False,
    failing: str = "an instance",
    conflict: str = "",
    unready: str = "",
    stuck: tuple[str, str] | None = None,
    seek_waiting: str = "",
    remaining: int = 0,
) -> tuple[list[Condition], str]:
    """The conditions and phase, the first that applies winning: what stops the consumer from running
    (its spec, a name another owns, a checkpoint it cannot read, sources not known), then what its
    instances say (stopped, exited, waiting for the API server), then its progress."""
    if problem:
        return conditions.stalled("InvalidSpec", problem), "Failed"
    if conflict:
        return conditions.stalled("Conflict", conflict), "Failed"
    if invalid:
        return conditions.stalled("CheckpointInvalid", invalid), "Failed"
    if seek_waiting:
        return conditions.waiting("SeekWaiting", seek_waiting), "Pending"
    if waiting:
        return conditions.waiting("SourcesNotResolved", f"waiting for its sourceRefs: {waiting}"), "Pending"
    if stopped(spec):
        word = "Suspended" if spec.get("state") == "suspended" else "Stopped"
        # Stopped once no pod of it is left, not once none is ready: an exited pod is still listed for a while
        if left := max(int(status.get("readyInstances") or 0), remaining):
            return conditions.waiting("Stopping", f"{left} instance(s) still stopping"), "Pending"
        return conditions.ready(word, "no instance runs; checkpoints are kept"), word
    if failure:
        reason = failure.split(":", 1)[0] if failure.split(":", 1)[0].isalnum() else "ConsumerFailing"
        verb = "stopped and waits to be replaced" if halted else "exited"
        return conditions.waiting(reason, f"{failing} {verb}: {failure}"), "Failed"
    wanted = int(spec.get("instances", 1))
    if stuck:  # a pod that will not start by waiting: the kubelet's or the scheduler's reason and words
        return conditions.waiting(
            stuck[0], f"{status['readyInstances']}/{wanted} instances ready; {stuck[1]}"
        ), "Pending"
    if unready:  # running, but held up (the API server does not take its checkpoints): it says why
        return conditions.waiting(
            "InstancesWaiting", f"{status['readyInstances']}/{wanted} instances ready; {unready}"
        ), "Pending"
    mode = status.get("consumptionMode", "INIT")
    if mode.startswith("BOOTSTRAP"):
        return conditions.waiting("Bootstrapping", f"bootstrapping ({mode})"), "Bootstrapping"
    if status["readyInstances"] < wanted:
        return conditions.waiting("Starting", f"{status['readyInstances']}/{wanted} instances ready"), "Pending"
    if "consumptionMode" not in status:  # nothing consumed yet (a quiet source), or not checkpointed yet
        return conditions.ready("Consuming", f"{wanted} instance(s) running; no checkpoint yet"), "Running"
    return conditions.ready("Consuming", f"{wanted} instance(s) consuming online"), "Running"
