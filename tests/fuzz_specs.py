"""Invalid and hostile specs for the Fibers custom resources, generated from the CRDs' OpenAPI schemas.

Why: admission (the CRD schema) is the first defence of the operator. Each case here is a deep copy of a
valid base spec with exactly one mutation at one schema location, made so that it breaks what the schema
declares there (a type, an enum, a pattern, a bound, a required or unknown field). A test that creates it
- with fieldValidation=Strict, as kubectl does, or unknown fields are only warned about - can expect a
rejection, and a failure names one field. CEL rules (x-kubernetes-validations) are not used: what they
catch is cross-field semantics, which belongs to hand-written cases.

Pure and deterministic: the same kind, schema, bases, count and seed give the same cases. Every value is
checked locally against the constraint it breaks (patterns with Python's re), and a value that cannot be
shown to break it is never emitted.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

FAMILIES: tuple[str, ...] = ("type", "enum", "pattern", "range", "required", "unknown", "huge", "unicode")
"""The mutation families, in the order cases() takes them round-robin."""

HUGE_LENGTH = 300_000
"""Characters of a huge string (300 kB of ASCII): far over any limit a field should take."""

Token = str | int
Tokens = tuple[Token, ...]


@dataclass(frozen=True)
class Case:
    """One invalid spec.

    path is where the mutation is: "spec", then ".field" for a property, "[0]" for a list index and
    '["key"]' (a JSON string) for a map key or a field name that is not a plain identifier.
    """

    name: str
    spec: dict[str, Any]
    family: str
    path: str
    why: str


class _Edit(NamedTuple):
    """A mutation of one base: set tokens to value, or delete it."""

    tokens: Tokens
    delete: bool
    value: Any
    why: str


@dataclass(frozen=True)
class _Mutation:
    base: int
    edit: _Edit


@dataclass(frozen=True)
class _Loc:
    """A location that exists in a base spec, with the schema that governs it."""

    tokens: Tokens
    schema: Mapping[str, Any]
    value: Any


def load_schema(crd_path: Path) -> dict[str, Any]:
    """The openAPIV3Schema of spec in the CRD's first version."""
    crd = yaml.safe_load(crd_path.read_text(encoding="utf-8"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    if not isinstance(spec, dict):
        raise ValueError(f"{crd_path}: spec has no schema")
    return spec


def cases(kind: str, schema: Mapping[str, Any], bases: list[dict[str, Any]], *, count: int, seed: int) -> list[Case]:
    """Exactly count cases, taking the families round-robin (a family with nothing to mutate is left out).

    Within a family the locations come first one value each, in a seeded order, so few cases cover many
    fields; when a family runs out it starts over. bases are not modified.
    """
    if count < 0:
        raise ValueError("count must not be negative")
    if not bases:
        raise ValueError("at least one valid base spec is needed")
    groups: dict[str, list[list[_Mutation]]] = {family: [] for family in FAMILIES}
    for index, base in enumerate(bases):
        for loc in _walk(schema, base, ()):
            for family, make in _MAKERS.items():
                edits = make(loc)
                if edits:
                    groups[family].append([_Mutation(index, edit) for edit in edits])
    rng = random.Random(f"{kind}/{seed}")
    plans: dict[str, list[_Mutation]] = {}
    for family in FAMILIES:
        if groups[family]:
            for values in groups[family]:
                rng.shuffle(values)
            rng.shuffle(groups[family])
            plans[family] = _interleave(groups[family])
    active = [family for family in FAMILIES if family in plans]
    if count and not active:
        raise ValueError(f"{kind}: nothing in the bases can be mutated")
    short = re.sub(r"[^a-z0-9]", "", kind.lower())[:40] or "x"
    out: list[Case] = []
    for i in range(count):
        family = active[i % len(active)]
        plan = plans[family]
        mutation = plan[(i // len(active)) % len(plan)]
        spec = _apply(bases[mutation.base], mutation.edit)
        out.append(Case(f"fz-{short}-{i}", spec, family, _format_path(mutation.edit.tokens), mutation.edit.why))
    return out


def _walk(schema: Mapping[str, Any], value: Any, tokens: Tokens) -> Iterator[_Loc]:
    """Every location of value the schema describes: properties, item 0 of a list, the first key of a map."""
    yield _Loc(tokens, schema, value)
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for key in sorted(value):
            if key in props:
                yield from _walk(props[key], value[key], (*tokens, key))
        extra = schema.get("additionalProperties")
        keys = sorted(key for key in value if key not in props)
        if isinstance(extra, Mapping) and keys:  # a map: one entry is enough, they share the schema
            yield from _walk(extra, value[keys[0]], (*tokens, keys[0]))
    elif isinstance(value, list) and value and isinstance(schema.get("items"), Mapping):
        yield from _walk(schema["items"], value[0], (*tokens, 0))


def _interleave(groups: list[list[_Mutation]]) -> list[_Mutation]:
    """The first value of each location, then the second of each, and so on."""
    out: list[_Mutation] = []
    depth = max(len(group) for group in groups)
    for level in range(depth):
        out.extend(group[level] for group in groups if level < len(group))
    return out


def _apply(base: dict[str, Any], edit: _Edit) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    parent: Any = spec
    for token in edit.tokens[:-1]:
        parent = parent[token]
    if edit.delete:
        del parent[edit.tokens[-1]]
    else:
        parent[edit.tokens[-1]] = copy.deepcopy(edit.value)
    return spec


_IDENT = re.compile(r"[A-Za-z0-9_-]+")


def _format_path(tokens: Tokens) -> str:
    out = "spec"
    for token in tokens:
        if isinstance(token, int):
            out += f"[{token}]"
        elif _IDENT.fullmatch(token):
            out += f".{token}"
        else:
            out += f"[{json.dumps(token, ensure_ascii=False)}]"
    return out


def _short(value: Any) -> str:
    """A one-line repr, cut short (repr escapes newlines and invisible characters)."""
    text = repr(value)
    if len(text) <= 60:
        return text
    size = f"{len(value)} {'chars' if isinstance(value, str) else 'items'}" if isinstance(value, str | list) else ""
    return f"{text[:40]}…({size or f'{len(text)} chars of repr'})"


def _violates(pattern: str, value: str) -> bool:
    """The value certainly does not match the pattern: no match with or without re.ASCII.

    The API server uses Go's regexp (RE2). For the simple patterns of the CRDs it agrees with Python's re,
    and where they differ (Python's $ also matching before a final newline, Unicode classes) Python matches
    more, so requiring no match in both modes errs on the safe side. A pattern re cannot compile is never
    claimed to be violated, nor is a value with a vertical tab (in Python's \\s, not in RE2's).
    """
    if "\v" in value:
        return False
    try:
        return re.search(pattern, value) is None and re.search(pattern, value, re.ASCII) is None
    except re.error:
        return False


def _unique(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if not any(type(value) is type(seen) and value == seen for seen in out):
            out.append(value)
    return out


_WRONG_TYPE: dict[str, tuple[Any, ...]] = {
    "string": (7, ["x"], {"x": "y"}),
    "integer": ("1", True),
    "number": ("1.5", True),
    "boolean": ("yes", 1),
    "object": (["x"], "x"),
    "array": ({"x": "y"}, "x"),
}


def _type(loc: _Loc) -> list[_Edit]:
    """A value of another JSON type. Not at the root (a spec stays an object) nor where any type goes."""
    declared = loc.schema.get("type")
    if (
        not loc.tokens
        or not isinstance(declared, str)
        or loc.schema.get("x-kubernetes-int-or-string")
        or loc.schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        return []
    return [
        _Edit(loc.tokens, False, wrong, f"type: {declared} given {type(wrong).__name__} {_short(wrong)}")
        for wrong in _WRONG_TYPE.get(declared, ())
    ]


_LOOKALIKES = {
    "a": "\u0430",
    "c": "\u0441",
    "e": "\u0435",
    "i": "\u0456",
    "o": "\u043e",
    "p": "\u0440",
    "x": "\u0445",
    "y": "\u0443",
    "A": "\u0410",
    "B": "\u0412",
    "C": "\u0421",
    "E": "\u0415",
    "N": "\u039d",
    "O": "\u041e",
    "P": "\u0420",
    "T": "\u0422",
}


def _lookalike(text: str) -> str:
    """The first letter that has one replaced by its Cyrillic or Greek twin."""
    for i, char in enumerate(text):
        if char in _LOOKALIKES:
            return text[:i] + _LOOKALIKES[char] + text[i + 1 :]
    return text + "\u0301"


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def _enum(loc: _Loc) -> list[_Edit]:
    """Near misses of the allowed values: case changes, lookalikes, padding, nothing at all."""
    allowed = loc.schema.get("enum")
    if not isinstance(loc.value, str) or not allowed or not all(isinstance(a, str) for a in allowed):
        return []
    values: list[str] = []
    for member in allowed:
        values += [
            member.capitalize(),
            member.upper(),
            member.lower(),
            member.swapcase(),
            _lookalike(member),
            _fullwidth(member),
            f"{member} ",
            f"{member}\u200b",
        ]
    values += ["", "unknown"]
    return [
        _Edit(loc.tokens, False, v, f"enum: {_short(v)} is not one of {allowed}")
        for v in _unique(values)
        if v not in allowed
    ]


def _pattern_violators(value: str) -> list[str]:
    """Strings near the valid value (and some not near at all) that a typical field pattern refuses."""
    return [
        f"{value} x",
        f" {value}",
        value.upper(),
        value.swapcase(),
        f"{value}..",
        "..",
        f"-{value}",
        f"{value}-",
        "café",
        f"{value}é",
        "🙂",
        f"{value}🙂",
        f"\u200f{value}",
        f"{value}\t",
        "\t",
        "",
        "a/b",
        "x" * 1000 + "!",
    ]


def _pattern(loc: _Loc) -> list[_Edit]:
    pattern = loc.schema.get("pattern")
    if not isinstance(loc.value, str) or not isinstance(pattern, str):
        return []
    return [
        _Edit(loc.tokens, False, v, f"pattern: {_short(v)} does not match {pattern}")
        for v in _unique(_pattern_violators(loc.value))
        if _violates(pattern, v)
    ]


def _distinct_item(item: Any, k: int) -> Any:
    """Another list item like item, told apart by a suffix (lists may demand unique items or names)."""
    if isinstance(item, str):
        return f"{item}{k}"
    other = copy.deepcopy(item)
    if isinstance(other, dict) and isinstance(other.get("name"), str):
        other["name"] = f"{other['name']}{k}"
    return other


def _range(loc: _Loc) -> list[_Edit]:
    """Numbers past minimum/maximum, lists past minItems/maxItems, strings past minLength/maxLength."""
    s, v = loc.schema, loc.value
    edits: list[tuple[Any, str]] = []
    if isinstance(v, int | float) and not isinstance(v, bool):
        low, high = s.get("minimum"), s.get("maximum")
        if isinstance(low, int | float):
            below: list[Any] = [low - 1, -1, -(10**12)] + ([low - 0.5] if s.get("type") == "number" else [])
            edits += [(b, f"below minimum {low}") for b in _unique(below) if b < low]
        if isinstance(high, int | float):
            edits += [(a, f"above maximum {high}") for a in _unique([high + 1, 10**12]) if a > high]
    elif isinstance(v, list) and v:
        fewest, most = s.get("minItems"), s.get("maxItems")
        if isinstance(fewest, int) and fewest > 0 and len(v) >= fewest:
            edits.append((v[: fewest - 1], f"{fewest - 1} items, minItems {fewest}"))
        if isinstance(most, int):
            more = copy.deepcopy(v) + [_distinct_item(v[0], k) for k in range(1, most + 2 - len(v))]
            edits.append((more, f"{len(more)} items, maxItems {most}"))
    elif isinstance(v, str):
        shortest, longest = s.get("minLength"), s.get("maxLength")
        if isinstance(shortest, int) and shortest > 0:
            edits.append(("a" * (shortest - 1), f"{shortest - 1} chars, minLength {shortest}"))
        if isinstance(longest, int):
            for n in _unique([longest + 1, min(10 * longest, longest + HUGE_LENGTH)]):
                edits.append(("a" * n, f"{n} chars, maxLength {longest}"))
    return [_Edit(loc.tokens, False, value, f"range: {_short(value)} ({why})") for value, why in edits]


def _required(loc: _Loc) -> list[_Edit]:
    """Each required property of an object, deleted."""
    required = loc.schema.get("required") or []
    if not isinstance(loc.value, dict):
        return []
    return [
        _Edit((*loc.tokens, key), True, None, f"required: {key!r} deleted, required by {_format_path(loc.tokens)}")
        for key in required
        if key in loc.value
    ]


_UNKNOWN_FIELDS = ("spce", "bootstrapServer", "🙂", "__proto__", "apiVersion")


def _unknown(loc: _Loc) -> list[_Edit]:
    """A field the schema does not know (a typo of a present one too), in an object that keeps no unknowns."""
    s, v = loc.schema, loc.value
    if (
        not isinstance(v, dict)
        or s.get("type") != "object"
        or "additionalProperties" in s
        or s.get("x-kubernetes-preserve-unknown-fields")
    ):
        return []
    props: Mapping[str, Any] = s.get("properties", {})
    typos = [key[:-1] for key in sorted(v) if len(key) > 1][:1]
    names = [n for n in _unique([*typos, *_UNKNOWN_FIELDS]) if n not in props and n not in v]
    return [
        _Edit((*loc.tokens, n), False, "fuzz", f"unknown: field {n!r} is not in the schema (Strict rejects it)")
        for n in names
    ]


@functools.cache
def _huge_strings() -> tuple[str, ...]:
    return ("a" * HUGE_LENGTH, "A" * HUGE_LENGTH, "a " * (HUGE_LENGTH // 2), "🙂" * (HUGE_LENGTH // 4))


def _huge(loc: _Loc) -> list[_Edit]:
    """300 kB into a string field whose maxLength or pattern it certainly breaks."""
    pattern, longest = loc.schema.get("pattern"), loc.schema.get("maxLength")
    if not isinstance(loc.value, str) or (pattern is None and longest is None):
        return []
    edits: list[_Edit] = []
    for v in _huge_strings():
        if isinstance(longest, int) and len(v) > longest:
            why = f"maxLength {longest}"
        elif isinstance(pattern, str) and _violates(pattern, v):
            why = f"does not match {pattern}"
        else:
            continue
        edits.append(_Edit(loc.tokens, False, v, f"huge: {len(v)} chars {_short(v[:8])}…, {why}"))
    return edits


_HOSTILE = (
    "\uff4f\uff52\uff44\uff45\uff52\uff53",  # fullwidth "orders"
    "orders\u200b",
    "../../etc/passwd",
    "$(rm -rf /)",
    "'; DROP TABLE x; --",
    "\u202eevil",
    "e\u0301",
    "İstanbul",
    "<script>alert(1)</script>",
    "${jndi:ldap://x/a}",
    "%2e%2e%2f",
    "\ufeffbom",
    "a\u2028b",
)


def _unicode(loc: _Loc) -> list[_Edit]:
    """Hostile strings into a field with a pattern they break - or, without a pattern, an enum they miss."""
    pattern, allowed = loc.schema.get("pattern"), loc.schema.get("enum")
    if not isinstance(loc.value, str):
        return []
    if isinstance(pattern, str):
        return [
            _Edit(loc.tokens, False, v, f"unicode: {_short(v)} does not match {pattern}")
            for v in _HOSTILE
            if _violates(pattern, v)
        ]
    if allowed:
        return [
            _Edit(loc.tokens, False, v, f"unicode: {_short(v)} is not one of {allowed}")
            for v in _HOSTILE
            if v not in allowed
        ]
    return []


_MAKERS: dict[str, Callable[[_Loc], list[_Edit]]] = {
    "type": _type,
    "enum": _enum,
    "pattern": _pattern,
    "range": _range,
    "required": _required,
    "unknown": _unknown,
    "huge": _huge,
    "unicode": _unicode,
}


# ----- valid specs to mutate: every field each kind has, so every field gets broken somewhere ----------

SECRET = {"name": "shop-mongo", "key": "uri"}
BY_REF = {"schemaRef": {"name": "orders"}}
BY_SUBJECT = {"subject": "shop.orders-value", "registry": "apicurio"}


def _view(source: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
    """A batch Transform with one input view."""
    return {"inputs": [{"name": "v", **source}], "sql": "SELECT * FROM v", "output": output}


BASES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "transforms": (
        "Transform",
        [
            {
                "mode": "batch",
                "inputs": [
                    {
                        "name": "orders",
                        "kafka": {"topics": ["shop.orders"], "startingOffsets": "latest", "schema": "id INT"},
                    }
                ],
                "sql": "SELECT * FROM orders",
                "output": {"kafka": {"topic": "shop.orders-out", "keyColumn": "id"}},
                "streamBack": {"topic": "shop.orders-back"},
                "kafka": {"bootstrapServers": "kafka:9092"},
                "spark": {
                    "image": "fibers-job:dev",
                    "serviceAccount": "fibers-job",
                    "volumes": [{"name": "data", "hostPath": {"path": "/tmp/fibers-demo", "type": "Directory"}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "x", "readOnly": True}],
                    "driver": {"cores": 1, "coreRequest": "200m", "memory": "512m"},
                    "executor": {"cores": 2, "coreRequest": "0.5", "memory": "1g", "instances": 2},
                    "sparkConf": {"spark.sql.shuffle.partitions": "4"},
                },
                "state": "running",
                "rerunNonce": "1",
                "schedule": "*/15 * * * *",
                "concurrencyPolicy": "Forbid",
                "successfulRunsHistoryLimit": 3,
                "failedRunsHistoryLimit": 1,
                "submissionDeadlineSeconds": 300,
            },
            {
                "mode": "streaming",
                "inputs": [
                    {
                        "name": "lines",
                        "files": {
                            "path": "/data/in",
                            "format": "csv",
                            "schema": "a STRING",
                            "options": {"header": "true"},
                        },
                    }
                ],
                "entrypoint": "jobs.lines:build",
                "output": {"files": {"path": "/data/out", "format": "parquet", "mode": "append"}},
                "checkpoint": {"location": "/data/checkpoints/lines"},
                "outputMode": "update",
            },
            {
                "inputs": [
                    {"name": "items", "mongodb": {"uriSecretRef": SECRET, "database": "shop", "collection": "items"}}
                ],
                "sql": "SELECT * FROM items",
                "output": {
                    "mongodb": {"uriSecretRef": SECRET, "database": "shop", "collection": "out", "idColumn": "id"}
                },
            },
            # Only item 0 of a list is mutated: one base per kind of input, and both ways of naming a schema.
            _view(
                {"connectRef": {"name": "orders-avro", "avro": BY_REF}}, {"kafka": {"topic": "t", "avro": BY_SUBJECT}}
            ),
            _view(
                {"connectRef": {"name": "orders-avro", "avro": BY_SUBJECT}}, {"kafka": {"topic": "t", "avro": BY_REF}}
            ),
            _view(
                {"connectRef": {"name": "orders-cdc", "schema": "id INT"}}, {"files": {"path": "/o", "format": "json"}}
            ),
            _view({"kafka": {"topics": ["shop.avro"], "avro": BY_REF}}, {"kafka": {"topic": "t"}}),
            _view({"kafka": {"topics": ["shop.avro"], "avro": BY_SUBJECT}}, {"kafka": {"topic": "t"}}),
        ],
    ),
    "databusconsumers": (
        "DatabusConsumer",
        [
            {
                "sources": ["shop.public.orders"],
                "relay": {"bootstrapServers": "kafka:9092", "avro": {"registry": "default"}},
                "bootstrap": {"enabled": True, "uriSecretRef": SECRET, "database": "shop_store"},
                "sink": {"type": "mongodb", "uriSecretRef": SECRET, "database": "shop", "collection": "orders"},
                "checkpoint": {
                    "configMapName": "orders-view-checkpoint",
                    "minIntervalSeconds": 1,
                    "retention": "Retain",
                },
                "startPosition": "bootstrap",
                "instances": 2,
                "state": "running",
                "restartNonce": "1",
                "seek": {"nonce": "1", "to": "earliest"},
                "callbackPolicy": {"timeoutSeconds": 60, "retries": 5, "retryBackoffSeconds": 1},
                "image": "fibers-job:dev",
                "serviceAccount": "fibers-consumer",
            },
            {
                "sources": ["shop.lineage"],
                "sink": {"type": "callback", "callback": "callbacks.audit:Audit", "options": {"level": "info"}},
            },
            {"sources": ["shop.public.orders"], "sink": {"type": "kafka", "topic": "shop.orders-rows"}},
        ],
    ),
    "connects": (
        "Connect",
        [
            {
                "cluster": "connect",
                "connectorName": "orders-cdc",
                "class": "io.debezium.connector.postgresql.PostgresConnector",
                "tasksMax": 1,
                "config": {"plugin.name": "pgoutput", "topic.prefix": "shop", "snapshot.fetch.size": 1024},
                "secretConfig": {"database.password": {"secretKeyRef": {"name": "shop-db", "key": "password"}}},
                "state": "running",
                "restartNonce": "1",
                "offsets": {"onCreate": "reset"},
                "autoRestart": {
                    "enabled": True,
                    "maxRestarts": 10,
                    "backoffSeconds": 60,
                    "maxBackoffSeconds": 1800,
                    "resetAfterSeconds": 600,
                },
            },
        ],
    ),
    "schemas": (
        "Schema",
        [
            {
                "registry": "apicurio",
                "subject": "shop.orders-report-avro-value",
                "schemaType": "AVRO",
                "schema": '{"type": "string"}',
                "compatibility": "BACKWARD",
                "references": [{"name": "shop.Item", "subject": "shop.item-value", "version": 1}],
                "deletionPolicy": "Retain",
                "adopt": False,
            },
        ],
    ),
}
