"""Keep the Helm chart's generated files in step with their sources.

- operator/fibers/crds/*.yaml are copies of crds/*.yaml too: the operator image applies them before an
  upgrade (`fibers crds apply`, the chart's pre-upgrade hook);
- charts/fibers/crds/*.yaml are byte-for-byte copies of crds/*.yaml and crds/kopf/*.yaml (kopf's
  peering CRDs, for the standby) — the one source of truth; helm does not follow symlinks reliably,
  so the chart carries copies;
- charts/fibers/argocd/argocd-cm-values.yaml carries charts/fibers/argocd/health.lua once per kind,
  as Argo CD keys health checks by group and kind, the health check for Applications (app of apps)
  from application-health.lua, and the two settings that keep Fibers' status updates visible.

Run it after editing either source:  python tools/sync_chart_crds.py
With --check it changes nothing and exits 1 when a generated file is stale (the chart test does this).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "crds"
KOPF_CRDS = CRDS / "kopf"  # shared with every kopf operator: installed once, never removed by the chart
CHART = REPO / "charts" / "fibers"
PACKAGE_CRDS = REPO / "operator" / "fibers" / "crds"  # in the operator image: `fibers crds apply` (the upgrade hook)
HEALTH_LUA = CHART / "argocd" / "health.lua"
APPLICATION_LUA = CHART / "argocd" / "application-health.lua"
ARGOCD_VALUES = CHART / "argocd" / "argocd-cm-values.yaml"
KINDS = ("Connect", "ConnectCluster", "Transform", "DatabusConsumer", "Schema", "SchemaRegistry", "Replay")

_HEADER = """\
# Argo CD health checks for Fibers resources. Generated from health.lua by tools/sync_chart_crds.py;
# edit health.lua, not this file.
#
# As values of the argo-cd Helm chart (configs.cm becomes the argocd-cm ConfigMap). With a plain
# argocd-cm ConfigMap, put the same keys under its `data:`.
#
# Besides the health checks, two settings. Argo CD ignores status-only updates of every resource
# by default (resource.customizations.ignoreResourceUpdates.all), so a new message under the same
# health (a second error while Degraded) would show only at its next periodic refresh, up to three
# minutes later. The `all` entry below keeps ignoring /status for every kind except fibers.dev's, and
# resource.compareoptions stops Argo CD adding its status-ignoring diff settings to that list.
# argoproj.io_Application lets an app of apps wait for each child Application to be Healthy.
configs:
  cm:
    resource.customizations.ignoreResourceUpdates.all: |
      jqPathExpressions:
        - select(.apiVersion | startswith("fibers.dev/") | not) | .status
    resource.compareoptions: |
      ignoreDifferencesOnResourceUpdates: false
"""


def _block(script: str) -> str:
    return "".join(f"      {line}\n" if line else "\n" for line in script.rstrip("\n").split("\n"))


def argocd_values(script: str, application: str) -> str:
    fibers = "".join(f"    resource.customizations.health.fibers.dev_{kind}: |\n{_block(script)}" for kind in KINDS)
    return _HEADER + fibers + f"    resource.customizations.health.argoproj.io_Application: |\n{_block(application)}"


def expected() -> dict[Path, bytes]:
    """Every generated file and the content it should have."""
    sources = sorted(CRDS.glob("*.yaml")) + sorted(KOPF_CRDS.glob("*.yaml"))
    files = {CHART / "crds" / src.name: src.read_bytes() for src in sources}
    files |= {PACKAGE_CRDS / src.name: src.read_bytes() for src in sorted(CRDS.glob("*.yaml"))}
    files[ARGOCD_VALUES] = argocd_values(HEALTH_LUA.read_text(), APPLICATION_LUA.read_text()).encode()
    return files


def stale() -> list[str]:
    """Generated files that are missing, different, or left over from a CRD that is gone."""
    want = expected()
    problems = [str(p.relative_to(REPO)) for p, data in want.items() if not p.exists() or p.read_bytes() != data]
    problems += [
        str(p.relative_to(REPO)) for d in (CHART / "crds", PACKAGE_CRDS) for p in d.glob("*.yaml") if p not in want
    ]
    return sorted(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args(argv)
    problems = stale()
    if args.check:
        for name in problems:
            print(f"stale: {name}")
        return 1 if problems else 0
    want = expected()
    for path in [*(CHART / "crds").glob("*.yaml"), *PACKAGE_CRDS.glob("*.yaml")]:
        if path not in want:
            path.unlink()
    for path, data in want.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    for name in problems:
        print(f"updated: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
