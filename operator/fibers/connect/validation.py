"""Kafka Connect's own validation of a connector config, turned into messages that name spec fields (pure).

Before a connector is created or its config changed, the config goes through
`PUT /connector-plugins/{class}/config/validate`; any error stops the change, and the resource's Ready
condition (reason InvalidConfig) names each field with Connect's message. A class the cluster does not
have is answered from the ConnectCluster's plugin list, which says what it does have.
"""

from __future__ import annotations

from typing import Any

from fibers.connect.spec import ConnectSpec
from fibers.redact import redact, truncate

# The keys the spec sets through fields of its own, not through spec.config.
OWN_FIELDS = {"connector.class": "spec.class", "tasks.max": "spec.tasksMax", "name": "spec.connectorName"}


def field_of(key: str, spec: ConnectSpec) -> str:
    """The spec field a Connect config key comes from (or would go in, for a missing required key)."""
    if key in OWN_FIELDS:
        return OWN_FIELDS[key]
    if key in spec.secret_refs:
        return f"spec.secretConfig.{key}"
    return f"spec.config.{key}"


def errors(result: dict[str, Any], spec: ConnectSpec) -> list[str]:
    """`<field>: <message>` for every error in a validate answer, in Connect's order."""
    found = []
    for entry in result.get("configs") or []:
        value = entry.get("value") or {}
        key = value.get("name") or (entry.get("definition") or {}).get("name", "?")
        found += [f"{field_of(key, spec)}: {message}" for message in value.get("errors") or []]
    return found


def describe(problems: list[str], secrets: tuple[str, ...]) -> str:
    """One message for the Ready condition: every problem, secret values masked, within the size limit."""
    count = len(problems)
    text = f"Kafka Connect rejects the config ({count} error{'s' if count != 1 else ''}): " + "; ".join(problems)
    return truncate(redact(text, secrets), 2048)


def _aliases(plugin_class: str) -> set[str]:
    """The names Connect accepts for a plugin: its class, its simple name, and that without `Connector`."""
    simple = plugin_class.rsplit(".", 1)[-1]
    return {plugin_class, simple, simple.removesuffix("Connector")}


def unknown_class(connector_class: str, plugins: list[dict[str, str]], cluster: str) -> str | None:
    """Why the class cannot run on the cluster, or None when it is installed (or the list is not known)."""
    if not plugins or any(connector_class in _aliases(p.get("class", "")) for p in plugins):
        return None
    installed = ", ".join(sorted(p.get("class", "") for p in plugins))
    return f"spec.class: {connector_class} is not installed on ConnectCluster {cluster}; it has: {installed}"
