"""`fibers crds apply` (the chart's pre-upgrade hook): what the image ships, and when a CRD counts as served."""

from __future__ import annotations

from pathlib import Path

import yaml

from fibers import crdsync

CRDS = Path(__file__).resolve().parents[2] / "crds"


def test_the_package_ships_exactly_the_repository_crds() -> None:
    shipped = {crd["metadata"]["name"]: crd for crd in crdsync.bundled()}
    source = {p.name.removesuffix(".yaml"): yaml.safe_load(p.read_text()) for p in CRDS.glob("*.yaml")}
    assert shipped == source
    for crd in shipped.values():
        storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
        assert storage == ["v1beta1"], crd["metadata"]["name"]


def test_a_crd_is_served_once_established_with_every_version_it_should_serve() -> None:
    established = {"conditions": [{"type": "Established", "status": "True"}]}
    both = {"versions": [{"name": "v1beta1", "served": True}, {"name": "v1alpha1", "served": True}]}
    assert crdsync._serving({"spec": both, "status": established}, {"v1beta1", "v1alpha1"})
    assert not crdsync._serving({"spec": both, "status": {}}, {"v1beta1"})  # not Established yet
    old = {"versions": [{"name": "v1alpha1", "served": True}]}
    assert not crdsync._serving({"spec": old, "status": established}, {"v1beta1", "v1alpha1"})
