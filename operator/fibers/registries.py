"""SchemaRegistry resources and the choice of one (pure): shared by Schemas and by the Avro inputs of
Transforms and DatabusConsumers, which name a registry the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PLURAL = "schemaregistries"
KIND = "SchemaRegistry"
CCOMPAT_PATH = "/apis/ccompat/v7"  # where Apicurio serves the Confluent-compatible API


@dataclass(frozen=True)
class RegistrySpec:
    name: str
    url: str  # the Confluent-compatible API's base, e.g. http://apicurio:8080/apis/ccompat/v7
    default: bool


def parse_registry(name: str, spec: Mapping[str, Any]) -> RegistrySpec:
    return RegistrySpec(name=name, url=str(spec["url"]).rstrip("/"), default=bool(spec.get("default", False)))


def parse_registries(objects: Iterable[Mapping[str, Any]]) -> list[RegistrySpec]:
    """SchemaRegistry objects as listed from the API server."""
    return [parse_registry(o["metadata"]["name"], o.get("spec") or {}) for o in objects]


class RegistryNotChosen(LookupError):
    """The Schema names no registry that exists, or there is no single default: the message says which."""


def choose_registry(
    requested: str | None, registries: Iterable[RegistrySpec], operator_default: str | None
) -> RegistrySpec:
    """spec.registry, else the operator's default (chart value schemaRegistry.default), else the one marked default."""
    by_name = {r.name: r for r in registries}
    if requested:
        if requested not in by_name:
            raise RegistryNotChosen(f"SchemaRegistry {requested!r} (spec.registry) does not exist")
        return by_name[requested]
    if operator_default:
        if operator_default not in by_name:
            raise RegistryNotChosen(f"the operator's default SchemaRegistry {operator_default!r} does not exist")
        return by_name[operator_default]
    marked = sorted(name for name, r in by_name.items() if r.default)
    if len(marked) == 1:
        return by_name[marked[0]]
    if not marked:
        raise RegistryNotChosen("spec.registry is not set and no SchemaRegistry is marked default")
    raise RegistryNotChosen(f"spec.registry is not set and several SchemaRegistries are marked default: {marked}")
