"""The Confluent Schema Registry REST API (v7), as Apicurio's `/apis/ccompat/v7` and Confluent serve it.

Only the calls the Schema reconciler makes. Errors come in two kinds, as for Kafka Connect: the
registry's own (JSON with an `error_code`, e.g. 40401 subject not found) and no answer at all
(connection refused, a proxy's error page), which is retried.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from fibers.redact import redact

SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
INVALID_SCHEMA = 42201
MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(Exception):
    """The registry answered with an error of its own."""

    def __init__(self, status_code: int, error_code: int, message: str) -> None:
        super().__init__(f"{error_code}: {message}")
        self.status_code = status_code
        self.error_code = error_code
        self.message = message


class RegistryUnreachable(Exception):
    """No answer from the registry's API."""


@dataclass(frozen=True)
class Registered:
    """One version of a subject."""

    subject: str
    version: int
    id: int
    schema: str = ""


@dataclass(frozen=True)
class Compatibility:
    compatible: bool
    messages: tuple[str, ...] = ()


class RegistryClient:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | bool = True,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.url = url.rstrip("/")
        self._secrets = secrets  # masked in every error this client raises
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(timeout),
            # A few calls a minute per registry: a small pool, kept alive between resyncs.
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
            headers={"Accept": MEDIA_TYPE, "Content-Type": MEDIA_TYPE, **(headers or {})},
            verify=tls,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, **params: str) -> Any:
        try:
            reply = await self._http.request(method, path, json=body, params=params or None)
        except httpx.HTTPError as exc:
            raise RegistryUnreachable(
                redact(f"schema registry at {self.url}: {exc or type(exc).__name__}", self._secrets)
            ) from None
        try:
            answer = reply.json() if reply.content else None
        except ValueError:
            answer = None
        if reply.status_code < 400:
            return answer
        if isinstance(answer, dict) and "error_code" in answer:
            message = redact(str(answer.get("message", "")), self._secrets)
            raise RegistryError(reply.status_code, int(answer["error_code"]), message)
        raise RegistryUnreachable(
            f"schema registry at {redact(self.url, [])} answered HTTP {reply.status_code} without an error of its own"
        )

    @staticmethod
    def _subject(subject: str) -> str:
        return quote(subject, safe="")

    async def subjects(self) -> list[str]:
        return list(await self._call("GET", "/subjects"))

    async def versions(self, subject: str) -> list[int]:
        """The subject's live versions; [] when it has none (or was soft-deleted)."""
        try:
            return sorted(int(v) for v in await self._call("GET", f"/subjects/{self._subject(subject)}/versions"))
        except RegistryError as exc:
            if exc.error_code == SUBJECT_NOT_FOUND:
                return []
            raise

    async def version(self, subject: str, version: int | str = "latest") -> Registered:
        found = await self._call("GET", f"/subjects/{self._subject(subject)}/versions/{version}")
        return Registered(found["subject"], int(found["version"]), int(found["id"]), found.get("schema", ""))

    async def lookup(self, subject: str, payload: dict[str, Any]) -> Registered | None:
        """The version of `subject` that holds this schema, or None when it is not registered there."""
        try:
            found = await self._call("POST", f"/subjects/{self._subject(subject)}", payload)
        except RegistryError as exc:
            if exc.error_code in (SUBJECT_NOT_FOUND, SCHEMA_NOT_FOUND):
                return None
            raise
        return Registered(found["subject"], int(found["version"]), int(found["id"]), found.get("schema", ""))

    async def check(self, subject: str, payload: dict[str, Any]) -> Compatibility:
        """Would this schema be accepted as the subject's next version, under its compatibility level?"""
        found = await self._call(
            "POST", f"/compatibility/subjects/{self._subject(subject)}/versions/latest", payload, verbose="true"
        )
        # Confluent lists `messages`; Apicurio gives one `reason` string.
        messages = [str(m) for m in found.get("messages") or ()]
        if found.get("reason"):
            messages.append(str(found["reason"]))
        return Compatibility(bool(found.get("is_compatible")), tuple(messages))

    async def register(self, subject: str, payload: dict[str, Any]) -> int:
        """Register the schema as the subject's next version (or find it); its global id."""
        found = await self._call("POST", f"/subjects/{self._subject(subject)}/versions", payload)
        return int(found["id"])

    async def compatibility(self, subject: str) -> str | None:
        """The subject's own level, or None when it follows the registry's global one.

        Apicurio answers NONE for a subject without a rule of its own (the global rule still applies),
        and cannot hold NONE for a subject as an override: its NONE removes the subject's rule.
        """
        try:
            found = await self._call("GET", f"/config/{self._subject(subject)}")
        except RegistryError as exc:
            if exc.error_code in (SUBJECT_NOT_FOUND, SUBJECT_COMPATIBILITY_NOT_CONFIGURED):
                return None
            raise
        return _level(found)

    async def global_compatibility(self) -> str:
        return _level(await self._call("GET", "/config")) or "NONE"

    async def set_compatibility(self, subject: str, level: str) -> None:
        await self._call("PUT", f"/config/{self._subject(subject)}", {"compatibility": level})

    async def delete_subject(self, subject: str) -> list[int]:
        """Soft-delete: the versions stop being served by subject; their ids still resolve."""
        try:
            return [int(v) for v in await self._call("DELETE", f"/subjects/{self._subject(subject)}")]
        except RegistryError as exc:
            if exc.error_code == SUBJECT_NOT_FOUND:
                return []
            raise

    async def schema_by_id(self, schema_id: int) -> dict[str, Any]:
        return dict(await self._call("GET", f"/schemas/ids/{schema_id}"))


def _level(found: Any) -> str | None:
    """GET /config answers {"compatibilityLevel": …} (Confluent) or {"compatibility": …}."""
    if not isinstance(found, dict):
        return None
    level = found.get("compatibilityLevel") or found.get("compatibility")
    return str(level) if level else None
