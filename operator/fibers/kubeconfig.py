"""The command line's Kubernetes client, for a person's laptop: the `kubernetes` package's kubeconfig loader.

The operator and its pods talk through the lean `fibers.kubeapi` (a service account, or the stack's one
kubeconfig). `fibers pipeline` runs where people keep several clusters: KUBECONFIG naming more than one
file (merged, as kubectl merges them), exec plugins (cloud logins) whose tokens expire and are renewed
when they do, client certificates from an exec plugin or inline data, and the context's namespace. The
`kubernetes` package does all of that as kubectl does; it is installed with `pip install 'fibers[cli]'`
and imported only here, only when the command runs.
"""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "fibers pipeline needs the kubernetes package: pip install 'fibers[cli]'"


class Kubeconfig:
    """Lists through the kubeconfig's current (or named) context."""

    def __init__(self, context: str | None = None) -> None:
        try:
            from kubernetes import config
        except ImportError as exc:
            raise SystemExit(INSTALL_HINT) from exc
        contexts, current = config.list_kube_config_contexts()
        chosen = next((c for c in contexts if c["name"] == context), None) if context else current
        if chosen is None:
            raise SystemExit(f"no context {context!r} in the kubeconfig")
        self.namespace: str = (chosen.get("context") or {}).get("namespace") or "default"
        self._client = config.new_client_from_config(context=chosen["name"])

    def items(self, url: str, **params: Any) -> list[dict[str, Any]]:
        """A list's items, as `fibers.kubeapi.Api.items` gives them (`labelSelector=…` as a keyword)."""
        data = self._client.call_api(
            url,
            "GET",
            query_params=list(params.items()),
            header_params={"Accept": "application/json"},
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
        return list(data.get("items") or [])

    def close(self) -> None:
        self._client.close()
