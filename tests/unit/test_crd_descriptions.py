"""Every node of every CRD schema says what it is: `kubectl explain` is the first place a user looks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml"))


def undescribed(node: Any, where: str) -> list[str]:
    """The paths under `node` (itself included) without a description: properties, list items, map values."""
    if not isinstance(node, dict):
        return []
    found = [] if "description" in node else [where]
    for name, child in (node.get("properties") or {}).items():
        found += undescribed(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        found += undescribed(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += undescribed(node["additionalProperties"], f"{where}{{}}")
    return found


@pytest.mark.parametrize("crd", CRDS, ids=[p.name for p in CRDS])
def test_every_schema_node_has_a_description(crd: Path) -> None:
    doc = yaml.safe_load(crd.read_text())
    for version in doc["spec"]["versions"]:
        properties = version["schema"]["openAPIV3Schema"]["properties"]
        missing = [path for part in ("spec", "status") for path in undescribed(properties.get(part), part)]
        assert missing == [], f"{crd.name} {version['name']}: no description on {missing}"


def test_the_walk_finds_list_items_and_map_values_without_one() -> None:
    schema = {
        "description": "s",
        "properties": {
            "a": {"description": "a", "items": {"type": "string"}},
            "m": {"description": "m", "additionalProperties": {"type": "string"}},
            "o": {"type": "object", "properties": {"x": {"description": "x"}}},
        },
    }
    assert undescribed(schema, "spec") == ["spec.a[]", "spec.m{}", "spec.o"]
