"""Benchmark: the operator's CPU per Kafka Connect REST call, on aiohttp (what it uses) and on httpx.

The design card names httpx as the HTTP library. The Connect client is the operator's busiest: a wave
of 1,000 new Connect resources is thousands of calls, on the same two cores as Connect itself, and the
wave's ready time against the REST-API floor is a goal (bench/connect_scale.py). So the client is kept
on aiohttp for as long as this figure says httpx costs more per call; the schema registry's client,
which makes a few calls a minute, is on httpx.

For each client and round, `--calls` GET /connectors (the listing the sync makes most often) through one
pooled client, `--parallel` at a time as ConnectPolicy.parallel_calls allows; CPU is this process's.
  aiohttp_cpu_ms_per_call, httpx_cpu_ms_per_call — medians over alternating rounds;
  httpx_over_aiohttp — the ratio (goal to switch: ≤ 1.1).
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.http_clients [--calls 1500] [--parallel 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import httpx

from bench.machine import Run, say


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def with_aiohttp(url: str, calls: int, parallel: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        gate = asyncio.Semaphore(parallel)

        async def one() -> None:
            async with gate, session.get(f"{url}/connectors") as response:
                await response.read()

        await asyncio.gather(*(one() for _ in range(calls)))


async def with_httpx(url: str, calls: int, parallel: int) -> None:
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        gate = asyncio.Semaphore(parallel)

        async def one() -> None:
            async with gate:
                (await client.get("/connectors")).raise_for_status()

        await asyncio.gather(*(one() for _ in range(calls)))


def measure(run: Callable[[str, int, int], Coroutine[Any, Any, None]], url: str, calls: int, parallel: int) -> float:
    """CPU milliseconds per call."""
    before = cpu_seconds()
    asyncio.run(run(url, calls, parallel))
    return (cpu_seconds() - before) / calls * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    session = Run("http_clients")
    url = session.stack().connect_url.rstrip("/")
    clients = {"aiohttp": with_aiohttp, "httpx": with_httpx}
    figures: dict[str, list[float]] = {name: [] for name in clients}
    for round_ in range(args.rounds):  # alternating, so a drift in the machine's load touches both
        for name in sorted(clients, reverse=bool(round_ % 2)):
            started = time.monotonic()
            figures[name].append(measure(clients[name], url, args.calls, args.parallel))
            say(
                f"round {round_ + 1}: {name} {figures[name][-1]:.3f} CPU ms per call "
                f"({time.monotonic() - started:.1f} s)"
            )
    results: dict[str, object] = {"calls": args.calls, "parallel": args.parallel, "rounds": args.rounds}
    for name, values in figures.items():
        results[f"{name}_cpu_ms_per_call"] = round(statistics.median(values), 3)
    ratio = statistics.median(figures["httpx"]) / statistics.median(figures["aiohttp"])
    results["httpx_over_aiohttp"] = round(ratio, 2)
    results["goals"] = {"httpx_over_aiohttp_le_1.1": ratio <= 1.1}
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
