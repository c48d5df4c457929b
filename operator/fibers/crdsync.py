"""Fibers' CRDs brought to this version's, for `helm upgrade` (`fibers crds apply`, the chart's hook Job).

Helm installs a chart's `crds/` once and never upgrades them, so without this every `helm upgrade` would
leave the cluster on the first release's schemas. The chart runs this before an upgrade (a pre-upgrade
hook Job, as the Spark Operator's chart does) from the operator image, which carries the CRDs as package
data (`fibers/crds/`, copies of the repository's `crds/`). Server-side apply with this field manager
takes over the fields it sets and leaves other managers' additions (labels a platform adds) alone. A
rollback runs the older release's hooks, so CRDs only move forward: an older operator still finds the
versions it uses served.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from fibers.kubeapi import Api

log = logging.getLogger("fibers.crds")

FIELD_MANAGER = "fibers-crds"
CRDS_URL = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class CrdSettings:
    established_seconds: float = 60.0  # how long a new version may take to be served before the upgrade fails
    poll_seconds: float = 0.5


def bundled() -> list[dict[str, Any]]:
    """This version's CRDs, as shipped in the package."""
    folder = resources.files("fibers") / "crds"
    return [
        yaml.safe_load(item.read_text())
        for item in sorted(folder.iterdir(), key=lambda i: i.name)
        if item.name.endswith(".yaml")
    ]


def apply(api: Api, crds: list[dict[str, Any]], settings: CrdSettings = CrdSettings()) -> list[str]:
    """Server-side apply each CRD, then wait until every one is Established with all its versions served."""
    names = []
    for crd in crds:
        name = crd["metadata"]["name"]
        api.request(
            "PATCH",
            f"{CRDS_URL}/{name}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=crd,  # JSON is YAML: the apply patch content type takes it
            content_type=APPLY_PATCH,
        )
        log.info("CRD applied", extra={"crd": name, "versions": [v["name"] for v in crd["spec"]["versions"]]})
        names.append(name)
    deadline = time.monotonic() + settings.established_seconds
    for crd in crds:
        name, wanted = crd["metadata"]["name"], {v["name"] for v in crd["spec"]["versions"] if v.get("served")}
        while not _serving(api.get(f"{CRDS_URL}/{name}"), wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CRD {name} not Established with {sorted(wanted)} served after {settings.established_seconds:g} s"
                )
            time.sleep(settings.poll_seconds)
    return names


def _serving(current: dict[str, Any], wanted: set[str]) -> bool:
    status = current.get("status") or {}
    established = any(
        c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    served = {v["name"] for v in (current.get("spec") or {}).get("versions") or [] if v.get("served")}
    return established and wanted <= served
