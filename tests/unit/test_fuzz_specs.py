"""The invalid-spec generator: exact, deterministic, and every case breaks what the CRD declares at its path.

The checks re-derive the schema from each case's path and validate with a small structural validator of
their own, so the generator does not vouch for itself.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz_specs import BASES, FAMILIES, HUGE_LENGTH, Case, cases, load_schema

CRDS = Path(__file__).resolve().parents[2] / "crds"
COUNT = 300
SEED = 15

# The Schema CRD declares no pattern anywhere in its spec: there is nothing for the pattern family to break.
NOT_APPLICABLE = {"schemas": {"pattern"}}

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TOKEN = re.compile(r'\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def _schema(plural: str) -> dict[str, Any]:
    return load_schema(CRDS / f"{plural}.fibers.dev.yaml")


def _generate(plural: str, seed: int = SEED, count: int = COUNT) -> list[Case]:
    kind, bases = BASES[plural]
    return cases(kind, _schema(plural), bases, count=count, seed=seed)


def _tokens(path: str) -> list[str | int]:
    assert path.startswith("spec")
    out: list[str | int] = []
    pos = len("spec")
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        assert match, f"unparsable path {path!r} at {pos}"
        name, index, quoted = match.groups()
        out.append(name if name is not None else int(index) if index is not None else json.loads(quoted))
        pos = match.end()
    return out


def _schema_at(schema: dict[str, Any], tokens: list[str | int]) -> dict[str, Any] | None:
    """The sub-schema at tokens, or None where the schema has no such field."""
    node: Any = schema
    for token in tokens:
        if isinstance(token, int):
            node = node.get("items")
        elif token in node.get("properties", {}):
            node = node["properties"][token]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    assert node is None or isinstance(node, dict)
    return node


_MISSING = object()


def _value_at(spec: Any, tokens: list[str | int]) -> Any:
    node = spec
    for token in tokens:
        if isinstance(token, int):
            if not isinstance(node, list) or token >= len(node):
                return _MISSING
        elif not isinstance(node, dict) or token not in node:
            return _MISSING
        node = node[token]
    return node


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def _type_ok(schema: dict[str, Any], value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    declared = schema.get("type")
    if declared is None:
        return True
    if isinstance(value, bool) and declared != "boolean":
        return False
    return isinstance(value, _TYPES[declared])


def _local_violations(schema: dict[str, Any], value: Any) -> list[str]:
    """What the schema's own keywords at this node refuse in value (not looking inside it)."""
    if not _type_ok(schema, value):
        return ["type"]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append("enum")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append("pattern")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            out.append("range")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and (value < schema.get("minimum", value) or value > schema.get("maximum", value)):
        out.append("range")
    if isinstance(value, list) and (
        len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value))
    ):
        out.append("range")
    return out


def _violations(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """A small structural validator: types, enums, patterns, bounds, required and unknown fields."""
    found = [f"{path}: {v}" for v in _local_violations(schema, value)]
    if found and found[0].endswith("type"):
        return found
    if isinstance(value, dict):
        props = schema.get("properties", {})
        found += [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in props:
                found += _violations(props[key], item, f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                found += _violations(schema["additionalProperties"], item, f"{path}[{key!r}]")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}: unknown")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += _violations(schema["items"], item, f"{path}[{i}]")
    return found


def _restored(case: Case, base: dict[str, Any]) -> dict[str, Any] | None:
    """The case with the value at its path put back as it is in base (or removed if base has none)."""
    tokens = _tokens(case.path)
    spec = copy.deepcopy(case.spec)
    parent: Any = _value_at(spec, tokens[:-1])
    before = _value_at(base, tokens)
    if before is not _MISSING and isinstance(parent, dict | list):
        target: Any = parent
        target[tokens[-1]] = copy.deepcopy(before)
    elif before is _MISSING and isinstance(parent, dict):
        parent.pop(tokens[-1], None)
    else:
        return None  # the case cannot have come from this base
    return spec


@pytest.mark.parametrize("plural", sorted(BASES))
def test_the_bases_are_valid(plural: str) -> None:
    schema = _schema(plural)
    for base in BASES[plural][1]:
        assert _violations(schema, base) == []


@pytest.mark.parametrize("plural", sorted(BASES))
def test_exact_count_unique_dns_names_and_deterministic(plural: str) -> None:
    generated = _generate(plural)
    assert len(generated) == COUNT
    names = [case.name for case in generated]
    assert len(set(names)) == COUNT
    assert all(DNS_LABEL.match(name) and len(name) <= 63 for name in names)
    assert generated == _generate(plural)
    assert generated != _generate(plural, seed=SEED + 1)
    assert len(_generate(plural, count=7)) == 7
    assert _generate(plural, count=0) == []


@pytest.mark.parametrize("plural", sorted(BASES))
def test_every_family_appears_round_robin(plural: str) -> None:
    generated = _generate(plural)
    expected = [f for f in FAMILIES if f not in NOT_APPLICABLE.get(plural, set())]
    assert [case.family for case in generated[: len(expected)]] == expected
    counts = {f: sum(case.family == f for case in generated) for f in expected}
    assert min(counts.values()) >= COUNT // len(expected)


def test_the_schema_crd_has_no_pattern_to_break() -> None:
    assert '"pattern"' not in json.dumps(_schema("schemas"))


@pytest.mark.parametrize("plural", sorted(BASES))
def test_each_case_breaks_the_constraint_declared_at_its_path(plural: str) -> None:
    schema = _schema(plural)
    for case in _generate(plural):
        tokens = _tokens(case.path)
        sub = _schema_at(schema, tokens)
        value = _value_at(case.spec, tokens)
        where = f"{case.name} {case.path}: {case.why}"
        assert "\n" not in case.why, where
        if case.family == "unknown":
            assert sub is None and value is not _MISSING, where
            continue
        assert sub is not None, where
        if case.family == "required":
            parent = _schema_at(schema, tokens[:-1])
            assert parent is not None and tokens[-1] in parent.get("required", []), where
            assert value is _MISSING, where
            continue
        assert value is not _MISSING, where
        broken = _local_violations(sub, value)
        if case.family == "unicode":
            assert ("pattern" in broken) if "pattern" in sub else ("enum" in broken), where
        elif case.family == "huge":
            assert len(value.encode()) >= HUGE_LENGTH, where
            assert {"pattern", "range"} & set(broken), where
        else:
            assert case.family in broken, where


@pytest.mark.parametrize("plural", sorted(BASES))
def test_each_case_is_invalid_and_changes_one_location_of_a_base(plural: str) -> None:
    schema = _schema(plural)
    bases = BASES[plural][1]
    for case in _generate(plural):
        assert isinstance(case.spec, dict)
        json.dumps(case.spec)
        assert _violations(schema, case.spec), f"{case.name} {case.path} is valid: {case.why}"
        assert any(_restored(case, base) == base for base in bases), f"{case.name} changed more than {case.path}"


@pytest.mark.parametrize("plural", sorted(BASES))
def test_the_bases_are_not_modified(plural: str) -> None:
    kind, bases = BASES[plural]
    before = copy.deepcopy(bases)
    generated = cases(kind, _schema(plural), bases, count=COUNT, seed=SEED)
    assert bases == before
    for case in generated:  # nor do the cases share anything mutable with them
        case.spec.clear()
    assert bases == before


def test_no_bases_is_an_error() -> None:
    with pytest.raises(ValueError, match="base"):
        cases("Schema", _schema("schemas"), [], count=1, seed=0)
