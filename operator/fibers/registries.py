"""SchemaRegistry resources and the choice of one (pure): shared by Schemas and by the Avro inputs of
Transforms and DatabusConsumers, which name a registry the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fibers.credentials import HttpAuth, parse_http_auth
from fibers.selectors import selector_matches

PLURAL = "schemaregistries"
KIND = "SchemaRegistry"
CCOMPAT_PATH = "/apis/ccompat/v7"  # where Apicurio serves the Confluent-compatible API


@dataclass(frozen=True)
class RegistrySpec:
    name: str
    url: str  # the Confluent-compatible API's base, e.g. http://apicurio:8080/apis/ccompat/v7
    default: bool
    # The namespaces whose resources may use it (a label selector; None: every namespace), and whether a
    # Schema may take over a subject registered outside Fibers (spec.adopt): the registry's owner decides,
    # never a namespace user's spec alone.
    namespace_selector: Mapping[str, Any] | None = None
    allow_adopt: bool = False
    # The operator's own calls (Schemas: register, check, delete) authenticate with these; the pods that
    # decode Avro read schemas by id without credentials, which they are never given.
    auth: HttpAuth = field(default_factory=HttpAuth)


def parse_registry(name: str, spec: Mapping[str, Any]) -> RegistrySpec:
    return RegistrySpec(
        name=name,
        url=str(spec["url"]).rstrip("/"),
        default=bool(spec.get("default", False)),
        namespace_selector=spec.get("namespaceSelector") or None,
        allow_adopt=bool(spec.get("allowAdopt", False)),
        auth=parse_http_auth(spec),
    )


def parse_registries(objects: Iterable[Mapping[str, Any]]) -> list[RegistrySpec]:
    """SchemaRegistry objects as listed from the API server."""
    return [parse_registry(o["metadata"]["name"], o.get("spec") or {}) for o in objects]


class RegistryNotChosen(LookupError):
    """The Schema names no registry that exists, or there is no single default: the message says which."""


def choose_registry(
    requested: str | None,
    registries: Iterable[RegistrySpec],
    operator_default: str | None,
    namespace: tuple[str, Mapping[str, str]] | None = None,
) -> RegistrySpec:
    """spec.registry, else the operator's default (chart value schemaRegistry.default), else the one marked
    default; one whose namespaceSelector does not match `namespace` (its name and labels) is refused."""
    chosen = _choose(requested, registries, operator_default)
    if chosen.namespace_selector and namespace is not None:
        name, labels = namespace
        if not selector_matches(dict(chosen.namespace_selector), dict(labels)):
            raise RegistryNotChosen(
                f"SchemaRegistry {chosen.name} does not allow namespace {name}: "
                "its spec.namespaceSelector does not match the namespace's labels"
            )
    return chosen


def needs_namespace(registries: Iterable[RegistrySpec]) -> bool:
    """Some registry limits its namespaces: the caller reads its namespace's labels for `choose_registry`."""
    return any(r.namespace_selector for r in registries)


def _choose(requested: str | None, registries: Iterable[RegistrySpec], operator_default: str | None) -> RegistrySpec:
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


def same_registry(url: str) -> str:
    """A registry URL in the one form two spellings of it share: scheme and host in lower case, no default
    port, no trailing slash. `http://Apicurio:80/apis/ccompat/v7/` and `http://apicurio/apis/ccompat/v7`
    are one registry; compared as text they were two, and a Schema through the second took over subjects
    held through the first. (Two host names of one server, a Service's short and full names, stay two:
    telling them apart needs DNS, and the platform team declares both.)"""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    try:
        port = parts.port if parts.port not in ({"http": 80, "https": 443}.get(scheme), None) else None
    except ValueError:  # not a port number: the registry cannot be reached at it anyway; its text stands
        return url.strip()
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port else ""
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def leads_to(registry: RegistrySpec, recorded: str | None) -> bool:
    """The registry's url leads to the server a status recorded (`same_registry` form), or none was recorded."""
    return recorded is None or recorded == same_registry(registry.url)
