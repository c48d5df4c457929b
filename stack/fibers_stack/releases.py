"""Helm releases of the third-party charts the stack installs (the Spark Operator's, Kueue's): one way to
run helm against the stack, and one way to install a chart with its values and wait for it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from fibers_stack import fetch


def helm(kubeconfig: str, *args: str) -> None:
    """Run helm on the stack's cluster; a failure raises with what helm said."""
    argv = [str(fetch.helm()), "--kubeconfig", kubeconfig, *args]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"helm {args[0]} failed: {result.stderr.strip() or result.stdout.strip()}")


def upgrade_install(
    kubeconfig: str, release: str, chart: Path, namespace: str, values: dict[str, Any], values_file: Path
) -> None:
    """Install (or change) a release with these values (kept in `values_file` to read afterwards) and wait
    until its resources are ready (at most 5 minutes)."""
    values_file.write_text(json.dumps(values, indent=2))
    helm(
        kubeconfig,
        "upgrade",
        "--install",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--create-namespace",
        "--values",
        str(values_file),
        "--wait",
        "--timeout",
        "5m",
    )
