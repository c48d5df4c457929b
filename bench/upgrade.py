"""Benchmark: `helm upgrade` of the operator under the demo's running pipeline — how long it takes, and the
longest time any resource of the pipeline is not Ready meanwhile.

Needs the demo running (`make demo`): the release `fibers` in `fibers-system`, its pipeline in `shop`. Each
round upgrades the release from the stack's OCI registry with one pod annotation changed, so the operator
pod is replaced (the chart's Deployment is Recreate: the old pod is gone before the new one starts), as in
an upgrade to a new image. A poller reads every resource of the pipeline twice a second from before the
upgrade until `--settle` seconds after it; a resource whose Ready leaves True counts the time until it is
True again. Figures per round and their worst: the upgrade's seconds, the operator's gap (old pod gone →
new pod Ready), each resource's longest not-Ready stretch. The last line printed is one JSON object.

    .venv/bin/python -m bench.upgrade [--rounds 3] [--settle 30]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config

from bench.machine import Run, say
from fibers_stack import StackInfo, fetch
from fibers_stack.demo import NAMESPACE, PLURALS, RELEASE, RELEASE_NAMESPACE

POLL_SECONDS = 0.5


@dataclass
class Watch:
    """Ready of every pipeline resource and of the operator pod, read every POLL_SECONDS in a thread."""

    api: client.ApiClient
    not_ready_since: dict[str, float] = field(default_factory=dict)
    longest: dict[str, float] = field(default_factory=dict)
    flips: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for key, ready in self._read().items():
                if not ready and key not in self.not_ready_since:
                    self.not_ready_since[key] = now
                    self.flips[key] = self.flips.get(key, 0) + 1
                elif ready and key in self.not_ready_since:
                    gap = now - self.not_ready_since.pop(key)
                    self.longest[key] = max(self.longest.get(key, 0.0), gap)
            time.sleep(POLL_SECONDS)

    def finish(self) -> None:
        self.stop.set()
        now = time.monotonic()
        for key, since in self.not_ready_since.items():  # still not Ready at the end: counted to now
            self.longest[key] = max(self.longest.get(key, 0.0), now - since)

    def _read(self) -> dict[str, bool]:
        custom = client.CustomObjectsApi(self.api)
        ready: dict[str, bool] = {}
        for kind, plural in PLURALS.items():
            for item in custom.list_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural)["items"]:
                conditions = (item.get("status") or {}).get("conditions") or []
                ready[f"{kind}/{item['metadata']['name']}"] = any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
                )
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            RELEASE_NAMESPACE, label_selector="fibers.dev/operator-role=active"
        )
        ready["operator pod"] = any(
            p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            for p in pods.items
        )
        return ready


def upgrade(info: StackInfo, marker: str) -> float:
    """`helm upgrade` of the demo's release with one pod annotation changed; its seconds."""
    argv = [
        str(fetch.helm()), "--kubeconfig", info.kubeconfig, "upgrade", RELEASE, *info.chart_source(),
        "--namespace", RELEASE_NAMESPACE, "--reuse-values", "--set-string", f"podAnnotations.bench-upgrade={marker}",
        "--wait", "--timeout", "5m",
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return time.monotonic() - started


def round_of(info: StackInfo, api: client.ApiClient, index: int, settle: float) -> dict[str, Any]:
    watch = Watch(api)
    if not all(watch._read().values()):
        raise SystemExit(f"round {index}: not every resource of the demo is Ready before the upgrade: {watch._read()}")
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    time.sleep(2)
    seconds = upgrade(info, f"{time.time():.0f}-{index}")
    say(f"round {index}: helm upgrade took {seconds:.1f} s; watching {settle:.0f} s more")
    time.sleep(settle)
    watch.finish()
    thread.join()
    resources = {k: round(v, 1) for k, v in watch.longest.items() if k != "operator pod"}
    result = {
        "helm_upgrade_seconds": round(seconds, 1),
        "operator_gap_seconds": round(watch.longest.get("operator pod", 0.0), 1),
        "longest_resource_gap_seconds": max(resources.values(), default=0.0),
        "resources_not_ready": resources,
        "ready_flips": {k: v for k, v in watch.flips.items() if k != "operator pod"},
    }
    say(f"round {index}: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds watched after each upgrade")
    args = parser.parse_args()
    run = Run("upgrade")
    info = run.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    rounds = [round_of(info, api, i + 1, args.settle) for i in range(args.rounds)]
    run.report(
        {
            "rounds": rounds,
            "helm_upgrade_seconds_max": max(r["helm_upgrade_seconds"] for r in rounds),
            "operator_gap_seconds_max": max(r["operator_gap_seconds"] for r in rounds),
            "longest_resource_gap_seconds": max(r["longest_resource_gap_seconds"] for r in rounds),
        }
    )


if __name__ == "__main__":
    main()
