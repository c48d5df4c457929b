"""HTTP credentials a platform team gives a cluster-scoped endpoint: ConnectClusters and SchemaRegistries.

Both name Secrets for Basic or Bearer authentication and for the certificate authority of an https URL,
in the same `auth` and `tls` blocks. Whoever may write such an object could otherwise have any Secret of
the cluster read and sent to a URL of their choosing, so a Secret is read only in the namespaces the
deployment allows (FIBERS_CREDENTIAL_NAMESPACES: the operator's own and those the chart lists); one
elsewhere is a problem named on the object, never read.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fibers.kube import SecretMissing, describe

SETTING = "credentialNamespaces"  # the chart value that lists the namespaces besides the operator's own


@dataclass(frozen=True)
class SecretKey:
    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class HttpAuth:
    """What the `auth` and `tls` blocks ask for (None: not asked)."""

    basic_user: SecretKey | None = None
    basic_password: SecretKey | None = None
    bearer_token: SecretKey | None = None
    ca: SecretKey | None = None
    insecure_skip_verify: bool = False


def named(auth: HttpAuth) -> frozenset[tuple[str, str]]:
    """The Secrets (namespace, name) the blocks name: a change to one of them is a change of credentials."""
    keys = (auth.basic_user, auth.basic_password, auth.bearer_token, auth.ca)
    return frozenset((k.namespace, k.name) for k in keys if k is not None)


def parse_http_auth(spec: Mapping[str, Any]) -> HttpAuth:
    """The `auth` and `tls` blocks of a spec (the CRD schema has checked their shape)."""
    auth, tls = spec.get("auth") or {}, spec.get("tls") or {}
    basic, bearer, ca = auth.get("basic"), auth.get("bearer"), tls.get("caSecretRef")

    def key(ref: Mapping[str, Any], default_key: str) -> SecretKey:
        return SecretKey(ref["namespace"], ref["name"], ref.get("key") or default_key)

    return HttpAuth(
        basic_user=key(basic["secretRef"], "username") if basic else None,
        basic_password=key(basic["secretRef"], "password") if basic else None,
        bearer_token=key(bearer["secretRef"], "token") if bearer else None,
        ca=key(ca, "ca.crt") if ca else None,
        insecure_skip_verify=bool(tls.get("insecureSkipVerify", False)),
    )


class SecretReader(Protocol):
    async def secret_value(self, namespace: str, name: str, key: str) -> str: ...


@dataclass(frozen=True)
class Resolved:
    """Headers and TLS for an HTTP client, and the secret values to mask wherever its errors are shown."""

    headers: dict[str, str]
    tls: ssl.SSLContext | bool
    secrets: tuple[str, ...]


class CredentialsRefused(ValueError):
    """A Secret outside the allowed namespaces: the message names it and the chart value."""


async def resolve(auth: HttpAuth, secrets: SecretReader, allowed: frozenset[str] | None, kind: str) -> Resolved:
    """Read the Secrets `auth` names (only in `allowed`; None: anywhere, for an operator run by hand).

    Raises CredentialsRefused, `fibers.kube.SecretMissing`, `ssl.SSLError` for a CA that is not PEM, or
    whatever the API server answered.
    """

    async def value(ref: SecretKey) -> str:
        if allowed is not None and ref.namespace not in allowed:
            raise CredentialsRefused(
                f"Secret {ref}: the operator reads {kind} credentials only in namespace(s) "
                f"{', '.join(sorted(allowed))} (chart value {SETTING})"
            )
        return await secrets.secret_value(ref.namespace, ref.name, ref.key)

    headers: dict[str, str] = {}
    masked: tuple[str, ...] = ()
    if auth.basic_user and auth.basic_password:
        user, password = await value(auth.basic_user), await value(auth.basic_password)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers, masked = {"Authorization": f"Basic {token}"}, (password, token)
    elif auth.bearer_token:
        token = (await value(auth.bearer_token)).strip()
        if any(c.isspace() or not c.isprintable() for c in token):
            # An HTTP client refuses such a header and quotes it, escaped, in its error: the token would reach
            # status and logs unmasked. Said here, naming the Secret, never the value.
            raise CredentialsRefused(f"Secret {auth.bearer_token}: the token holds whitespace or control characters")
        headers, masked = {"Authorization": f"Bearer {token}"}, (token,)
    tls: ssl.SSLContext | bool = True
    if auth.insecure_skip_verify:
        tls = False
    elif auth.ca:
        tls = ssl.create_default_context(cadata=await value(auth.ca))
    return Resolved(headers, tls, masked)


def problem(exc: Exception) -> str:
    """What to say on the object of a `resolve` that failed: a Secret missing, refused or not PEM as such;
    anything else (forbidden, the API server busy) as a Secret that could not be read, to be read again."""
    if isinstance(exc, (SecretMissing, ValueError, ssl.SSLError)):
        return str(exc)
    return f"cannot read a Secret: {describe(exc)}"
