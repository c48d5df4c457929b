"""Whose an object a consumer would use is: its checkpoint ConfigMap, its StatefulSet, its Leases (pure).

Both are found by name, and names are the user's word: `spec.checkpoint.configMapName` may name any
ConfigMap of the namespace, and a consumer's StatefulSet has the consumer's name, which another
workload may have already. Two consumers given one checkpoint name would resume from each other's
offsets (and skip records); a seek or `retention: Delete` would delete whatever ConfigMap is named;
a StatefulSet of someone else's would be patched to run consumer pods, or deleted by a seek; and a
Lease of a partition's name made by someone else would be taken over, or hold the partition for good. So an
object is a consumer's only when it carries the consumer's label (the consumer's instances and the
operator set it on what they create); one without it is read, written and deleted by nobody, and the
consumer says so (`Conflict`). The name, not the uid, is the owner: a consumer deleted with
`retention: Retain` and created again under its name resumes from its checkpoints.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

LABEL_CONSUMER = "fibers.dev/databusconsumer"  # on everything a consumer's instances and the operator make for it
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def lease_prefix(consumer: str, topic: str) -> str:
    """What the names of a topic's Leases start with (the partition follows as `-p<n>`).

    Topic names allow `_`, `.` and capitals, which Lease names do not; a short hash of the topic keeps
    two topics that read the same once lowered and dashed apart.
    """
    digest = hashlib.sha256(topic.encode()).hexdigest()[:8]
    readable = _NOT_DNS.sub("-", topic.lower()).strip("-")[:60]
    return f"{consumer[:170]}-{readable}-{digest}".replace("--", "-")


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


def foreign_lease(lease: dict[str, Any] | None, consumer: str) -> str:
    """Why this Lease (as read; None: absent) is not one of `consumer`'s: "" when it is, or is absent."""
    if lease is None or not (whose := _whose(lease, "Lease", consumer)):
        return ""
    return f"{whose}: its partition is not consumed while it exists; delete it, or give the consumer another name"


def foreign_leases(leases: Iterable[dict[str, Any]], consumer: str, prefixes: Iterable[str]) -> str:
    """The first of a namespace's Leases named as one of `consumer`'s partitions (a name in `prefixes`
    followed by `-p<partition>`) that is not the consumer's; "" when there is none."""
    pattern = re.compile("|".join(f"{re.escape(p)}-p[0-9]+" for p in sorted(set(prefixes))) or "(?!)")
    for lease in sorted(leases, key=lambda o: str((o.get("metadata") or {}).get("name"))):
        if pattern.fullmatch(str((lease.get("metadata") or {}).get("name"))) and (
            why := foreign_lease(lease, consumer)
        ):
            return why
    return ""
