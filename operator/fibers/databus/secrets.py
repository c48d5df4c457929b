"""A consumer's Secrets (its sinks' and bootstrap store's MongoDB URIs): a changed value reaches new pods only.

The pods take the values as environment variables (by secretKeyRef) when they start, so a rotated Secret
must replace them. The StatefulSet records a digest of the values it runs with (`HASH` in its own
annotations); when a Secret it names changes (the operator's watch of Secrets, `fibers.secret_refs`) the
digest is taken again, and only if it differs does the pod template get it too, which has the StatefulSet
replace its pods one at a time. The values themselves never leave the API server's answer: only the digest
is written. A StatefulSet from before this (no digest) gets its first one without a restart. Pure.
"""

from __future__ import annotations

from typing import Any

from fibers.databus.config import sink_specs
from fibers.secret_refs import SecretKey, digest

__all__ = ["HASH", "SecretKey", "digest", "digests", "referenced"]

HASH = "fibers.dev/secrets-hash"


def referenced(spec: dict[str, Any]) -> list[SecretKey]:
    """Every Secret key the consumer's pods take, in a stable order."""
    refs = [sink["uriSecretRef"] for _, sink in sink_specs(spec) if sink.get("uriSecretRef")]
    if (spec.get("bootstrap") or {}).get("enabled"):
        refs.append(spec["bootstrap"]["uriSecretRef"])
    return sorted({(str(r["name"]), str(r["key"])) for r in refs})


def digests(existing: dict[str, Any] | None, now: str | None) -> tuple[str | None, str | None, bool]:
    """(the StatefulSet's digest, the pod template's, whether the pods are to be replaced), given the
    StatefulSet as it is and the digest taken now (None: not taken, nothing changed that would tell)."""
    meta = ((existing or {}).get("metadata") or {}).get("annotations") or {}
    template = ((((existing or {}).get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "annotations"
    ) or {}
    recorded, rolled = meta.get(HASH), template.get(HASH)
    if now is None or now == recorded:
        return recorded, rolled, False
    if recorded is None:  # the first digest of a StatefulSet: nothing to compare with, nothing restarted
        return now, rolled, False
    return now, now, True
