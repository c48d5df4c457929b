"""Whose an object a consumer would use is: its checkpoint ConfigMap, its StatefulSet (pure: no I/O).

Both are found by name, and names are the user's word: `spec.checkpoint.configMapName` may name any
ConfigMap of the namespace, and a consumer's StatefulSet has the consumer's name, which another
workload may have already. Two consumers given one checkpoint name would resume from each other's
offsets (and skip records); a seek or `retention: Delete` would delete whatever ConfigMap is named;
and a StatefulSet of someone else's would be patched to run consumer pods, or deleted by a seek. So an
object is a consumer's only when it carries the consumer's label (the consumer's instances and the
operator set it on what they create); one without it is read, written and deleted by nobody, and the
consumer says so (`Conflict`). The name, not the uid, is the owner: a consumer deleted with
`retention: Retain` and created again under its name resumes from its checkpoints.
"""

from __future__ import annotations

from typing import Any

LABEL_CONSUMER = "fibers.dev/databusconsumer"  # on everything a consumer's instances and the operator make for it


def _whose(obj: dict[str, Any], kind: str, consumer: str) -> str:
    """ "" when `obj` carries `consumer`'s label; else what it is, for a Conflict message."""
    meta = obj.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_CONSUMER)
    if owner == consumer:
        return ""
    whose = f"belongs to consumer {owner}" if owner else f"was not created for a consumer (no label {LABEL_CONSUMER})"
    return f"{kind} {meta.get('name')} {whose}"


def foreign_checkpoint(configmap: dict[str, Any] | None, consumer: str) -> str:
    """Why this ConfigMap (as read; None: absent) is not `consumer`'s checkpoint: "" when it is, or is absent."""
    if configmap is None or not (whose := _whose(configmap, "ConfigMap", consumer)):
        return ""
    return (
        f"{whose}: it is not read, written or deleted as this consumer's checkpoint; name another "
        f"spec.checkpoint.configMapName, or label it {LABEL_CONSUMER}={consumer} to hand it over"
    )


def foreign_workload(statefulset: dict[str, Any] | None, consumer: str) -> str:
    """Why this StatefulSet (as read; None: absent) is not `consumer`'s instances: "" when it is, or is absent."""
    if statefulset is None or not (whose := _whose(statefulset, "StatefulSet", consumer)):
        return ""
    return f"{whose}: it is not changed or deleted to run this consumer; give the consumer another name"
