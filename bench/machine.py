"""What every benchmark shares: progress lines a person can read, and the machine's load around the run.

Two cores are shared with Kafka, Kafka Connect, the API server and the kubelet, so one figure
means little without the load it was measured under. Each benchmark opens a `Run` at its start
and ends with `Run.report(results)`: the last line printed is one JSON object with the figures,
the load average (1, 5 and 15 minutes) before and after, and how long the run took.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fibers_stack
from fibers_stack import StackInfo, namespaces, process


def free_port() -> int:
    """A loopback port nothing listens on now, outside the range outgoing connections take theirs from."""
    return process.free_port("127.0.0.1")


def wait(predicate: Any, timeout: float, what: str) -> None:
    """Poll `predicate` every 0.25 s; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.25)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has been busy (every process, pods included), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_quiet(busy_seconds: Callable[[], float], cores: float, seconds: int, limit: float = 120.0) -> float:
    """Wait until `busy_seconds` (CPU seconds so far) grows by less than `cores` per second for `seconds`
    seconds in a row, or `limit` seconds have passed; the seconds waited.

    A fixed pause cannot know how long the after-work of the last phase lasts (a cleanup, pods ending).
    """
    started = time.monotonic()
    calm = 0
    while calm < seconds and time.monotonic() - started < limit:
        before = busy_seconds()
        time.sleep(1.0)
        calm = calm + 1 if busy_seconds() - before < cores else 0
    return time.monotonic() - started


def say(message: str) -> None:
    """A progress line, timestamped, flushed at once (benchmarks run for minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Run:
    """One benchmark run: the machine's load when it started, and the report at its end."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = benchmark
        self.started = time.monotonic()
        self.load_before = load_average()
        say(f"{benchmark}: {os.cpu_count()} CPUs, load average {self.load_before} (1, 5, 15 min)")

    def stack(self) -> StackInfo:
        """The local stack, started now or already running."""
        say("starting (or reusing) the local stack")
        return fibers_stack.up()

    def machine(self) -> dict[str, Any]:
        """The machine's figures for the report, read now."""
        after = load_average()
        say(f"{self.benchmark}: load average {self.load_before} before, {after} after")
        return {
            "cpus": os.cpu_count(),
            "load_average_before": self.load_before,
            "load_average_after": after,
            "seconds": round(time.monotonic() - self.started, 1),
        }

    def report(self, results: dict[str, Any]) -> None:
        """Print the last line: one JSON object with every figure and the machine's load."""
        print(json.dumps({"benchmark": self.benchmark, **results, "machine": self.machine()}), flush=True)


def dies_with_parent() -> None:
    """A child's `preexec_fn`: the kernel sends it SIGTERM when the benchmark dies (even by SIGKILL), so an
    interrupted run leaves no operator behind to poll Connect and reconcile a namespace nobody measures."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def operator_process(info: StackInfo, namespace: str, log_file: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The operator as a process of its own watching `namespace` (pods run as the chart's job account),
    logging to `log_file`; stopped on leaving."""
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "fibers", "run", "-n", namespace],
            stdout=log,
            stderr=log,
            env={
                **os.environ,
                **info.env(),
                "FIBERS_JOB_SERVICE_ACCOUNT": namespaces.JOBS_SERVICE_ACCOUNT,
                "FIBERS_CONSUMER_SERVICE_ACCOUNT": namespaces.CONSUMER_SERVICE_ACCOUNT,
            },
            preexec_fn=dies_with_parent,
        )
        try:
            yield process
        finally:
            process.terminate()
            process.wait(30)
