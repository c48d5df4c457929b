"""The command line's Kubernetes client, for a person's laptop: the `kubernetes` package's kubeconfig loader.

The operator and its pods talk through the lean `fibers.kubeapi` (a service account, or the stack's one
kubeconfig). `fibers pipeline` runs where people keep several clusters: KUBECONFIG naming more than one
file (merged, as kubectl merges them), exec plugins (cloud logins) whose tokens expire and are renewed
when they do, client certificates from an exec plugin or inline data, and the context's namespace. The
`kubernetes` package does all of that as kubectl does; it is installed with `pip install 'fibers[cli]'`
and imported only here, only when the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import yaml

from fibers.api import GROUP, VERSION

INSTALL_HINT = "fibers pipeline and fibers replay need the kubernetes package: pip install 'fibers[cli]'"


class Kubeconfig:
    """Lists through the kubeconfig's current (or named) context."""

    def __init__(self, context: str | None = None) -> None:
        try:
            from kubernetes import config
        except ImportError as exc:
            raise SystemExit(INSTALL_HINT) from exc
        try:
            contexts, current = config.list_kube_config_contexts()
            context = context or _first_current_context() or current["name"]
            chosen = next((c for c in contexts if c["name"] == context), None)
            if chosen is None:
                raise SystemExit(f"no context {context!r} in the kubeconfig")
            self.namespace: str = (chosen.get("context") or {}).get("namespace") or "default"
            self._client = config.new_client_from_config(context=chosen["name"])
        except config.ConfigException as exc:  # a person's file: say what is wrong with it, no traceback
            raise SystemExit(f"kubeconfig: {exc}") from None

    def custom_objects(self, plural: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        """Fibers objects of a kind with these labels, in a namespace (None: every namespace)."""
        from kubernetes import client

        api = client.CustomObjectsApi(self._client)
        if namespace is None:
            listing = api.list_cluster_custom_object(GROUP, VERSION, plural, label_selector=label_selector)
        else:
            listing = api.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, label_selector=label_selector
            )
        return list(cast(dict[str, Any], listing).get("items") or [])

    def create_object(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import client

        api = client.CustomObjectsApi(self._client)
        return cast(dict[str, Any], api.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body))

    def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes import client

        api = client.CustomObjectsApi(self._client)
        return cast(dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name))

    def patch_object(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of a fibers.dev object."""
        from kubernetes import client

        api = client.CustomObjectsApi(self._client)
        return cast(dict[str, Any], api.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, patch))

    def close(self) -> None:
        self._client.close()


def _first_current_context() -> str | None:
    """The current context as kubectl picks it from several KUBECONFIG files: the first file that names
    one (the kubernetes package lets a later file override it)."""
    for path in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        file = Path(path).expanduser() if path else None
        if file and file.is_file():
            named = (yaml.safe_load(file.read_text()) or {}).get("current-context")
            if named:
                return str(named)
    return None
