"""The Schema reconciler's settings: its pace, and what the deployment gives it (read from the
environment by `fibers.settings`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemaSettings:
    """The Schema reconciler's pace: kopf's timers are declared with the defaults, so only `resync` is tunable
    (operator environment FIBERS_SCHEMA_RESYNC)."""

    resync: float = 60.0  # seconds between looks at an in-sync subject (drift, deleted versions)
    retry: float = 10.0  # seconds between tries while the registry does not answer (the Schema timer's beat)
    registry_probe: float = 60.0  # seconds between probes of a SchemaRegistry
    # Where a SchemaRegistry's Secrets may be (FIBERS_CREDENTIAL_NAMESPACES, `fibers.credentials`); None: any.
    secret_namespaces: frozenset[str] | None = None
