"""What the Transform job's MongoDB input and output share: where the URI comes from, how long to wait.

The job spec only names an environment variable (the operator sets it from a secretKeyRef), so the URI
is in neither the spec nor the SparkApplication; the driver reads it when it needs it. Reads and writes
give up on an unreachable server after the same time (`fibers.mongodb`).
"""

from __future__ import annotations

import os


def env_value(name: str) -> str:
    """A connection URI handed to the pod through the environment (the spec only names the variable)."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set (it should hold the MongoDB URI)")
    return value
