"""Install (or update) Fibers' CRDs from `crds/` on the stack's API server, for tests, the demo and benchmarks.

In production the chart installs them; here every caller wants the same thing: the repository's
CRDs as they are now (replaced when they exist, so a schema edit is seen), served before the
first resource is created.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

CRDS = Path(__file__).resolve().parents[2] / "crds"


def apply(api: client.ApiClient, *, timeout: float = 30, paths: list[Path] | None = None) -> list[str]:
    """Create or replace every CRD in crds/ (or in `paths`) and wait until each is Established; their names."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in paths if paths is not None else sorted(CRDS.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        try:
            current = ext.read_custom_resource_definition(name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version if current.metadata else None
            ext.replace_custom_resource_definition(name, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(body)
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(ext, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    return names


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    status = ext.read_custom_resource_definition(name).status
    return any(c.type == "Established" and c.status == "True" for c in (status.conditions if status else None) or [])
