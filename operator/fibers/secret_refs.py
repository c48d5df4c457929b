"""Which resources refer to which Secrets, so that a Secret's change reaches them and nothing else.

Each kind notes, whenever it reads a resource's spec, the Secrets that spec names (`note`). The watch of
Secrets (`watches.SECRETS`: every Secret of the served namespaces, by its metadata only) hands each change
on, and `referring` answers the resources to look at again; a change to a Secret nobody names costs a
lookup. The index holds names only, never a value, and no Secret object is kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

Resource = tuple[str, str, str]  # (kind, namespace, name)
SecretKey = tuple[str, str]  # (Secret name, key)
Keyed = tuple[str, str]  # (the Secret's uid, the value): what a digest is taken of


def digest(values: dict[SecretKey, Keyed | None]) -> str:
    """A digest of Secret values (None: not there), never reversible to them: what a resource records to
    tell, when a Secret it names changes, whether the values it runs with moved.

    Each value is keyed by its Secret's uid (an HMAC): the digest sits where readers of the namespace see it
    (a Transform's status, a StatefulSet's annotations) and the Secret's name and key are in the spec, so a
    plain hash let anyone who may not read the Secret test guesses of a short password offline; the uid is
    known only to those who may read the Secret."""
    h = hashlib.sha256()
    for (name, key), keyed in sorted(values.items()):
        if keyed is None:
            h.update(f"{name}\0{key}\0-\0".encode())
            continue
        uid, value = keyed
        mac = hmac.new(uid.encode(), f"{name}\0{key}\0{value}".encode(), hashlib.sha256).hexdigest()
        h.update(f"{name}\0{key}\0+{mac}\0".encode())
    return h.hexdigest()[:16]


class SecretRefs:
    def __init__(self) -> None:
        self._by_secret: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (namespace, secret) → {(kind, name)}
        self._by_resource: dict[Resource, frozenset[str]] = {}

    def note(self, kind: str, namespace: str, name: str, secrets: Iterable[str]) -> None:
        """The Secrets a resource's spec names now (in its own namespace), replacing what it named before."""
        key, now = (kind, namespace, name), frozenset(secrets)
        before = self._by_resource.get(key, frozenset())
        if now == before:
            return
        for secret in before - now:
            users = self._by_secret.get((namespace, secret), set())
            users.discard((kind, name))
            if not users:
                self._by_secret.pop((namespace, secret), None)
        for secret in now - before:
            self._by_secret.setdefault((namespace, secret), set()).add((kind, name))
        if now:
            self._by_resource[key] = now
        else:
            self._by_resource.pop(key, None)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self.note(kind, namespace, name, ())

    def referring(self, namespace: str, secret: str) -> list[tuple[str, str]]:
        """The resources (kind, name) whose specs name this Secret, in a stable order."""
        return sorted(self._by_secret.get((namespace, secret), ()))
