"""Kafka Connect REST API client (async, one per Connect cluster).

Only what the operator needs. Writes answer 202 before the change happens: callers verify the
outcome on a later read, never by the status code alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from fibers import metrics
from fibers.redact import redact

log = logging.getLogger("fibers.connect.rest")


class ConnectError(Exception):
    """Kafka Connect answered with an error."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message

    @property
    def already_exists(self) -> bool:
        """409 to a create: the name is taken ("Connector x already exists"); retrying will not help."""
        return self.status_code == 409 and "already exists" in self.message

    @property
    def rebalancing(self) -> bool:
        """Another 409: the workers are rebalancing; the same call can be retried shortly."""
        return self.status_code == 409 and not self.already_exists


class ConnectUnreachable(Exception):
    """No answer from Kafka Connect at all."""


@dataclass(frozen=True)
class TaskView:
    id: int
    state: str
    worker_id: str = ""
    trace: str = ""


@dataclass(frozen=True)
class ConnectorView:
    """One connector as the expanded listing shows it."""

    name: str
    config: dict[str, str] | None  # None: the listing was asked without configs
    state: str
    worker_id: str = ""
    trace: str = ""
    type: str = ""
    tasks: tuple[TaskView, ...] = field(default_factory=tuple)

    @classmethod
    def from_listing(cls, name: str, entry: dict[str, Any]) -> ConnectorView:
        info, status = entry.get("info") or {}, entry.get("status") or {}
        connector = status.get("connector") or {}
        return cls(
            name=name,
            config={k: str(v) for k, v in (info.get("config") or {}).items()} if "info" in entry else None,
            state=connector.get("state", "UNASSIGNED"),
            worker_id=connector.get("worker_id", ""),
            trace=connector.get("trace", ""),
            type=status.get("type") or info.get("type") or "",
            tasks=tuple(
                TaskView(t["id"], t.get("state", "UNASSIGNED"), t.get("worker_id", ""), t.get("trace", ""))
                for t in sorted(status.get("tasks") or [], key=lambda t: t["id"])
            ),
        )


@dataclass(frozen=True)
class Reply:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


def error_from(url: str, reply: Reply) -> ConnectError | ConnectUnreachable:
    """Kafka Connect's own error (JSON with an `error_code`), or, for any other error page, unreachable.

    While a worker starts or stops, its web server answers before (or after) its REST resources are
    there: a bare 404 page for every path. Taken for Connect's "connector not found", it made a
    deletion look done while the connector still ran. A proxy's error page is no answer from Connect either.
    """
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error_code" in body:
        return ConnectError(reply.status_code, str(body.get("message") or reply.body.decode(errors="replace")))
    return ConnectUnreachable(
        redact(
            f"Kafka Connect at {url} is not answering its REST API yet (HTTP {reply.status_code}, not its own error)",
            [],
        )
    )


class ConnectClient:
    """One Connect cluster's REST API over aiohttp, not httpx: at 1,000 connectors the operator makes
    thousands of calls in a burst, on the same cores as Connect, and httpx's async client costs about ten
    times aiohttp's CPU per call (bench/http_clients.py: 1.7 against 0.13 ms)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        parallel: int,
        headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | bool = True,
    ) -> None:
        """`timeout` and `parallel` are `ConnectPolicy`'s `call_timeout` and `parallel_calls`; `headers` carry
        the credentials (never logged); `tls` is a context with the cluster's CA, True for the system's CAs,
        or False to skip verification."""
        self.url = url.rstrip("/")
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=tls),
        )
        # Connect serialises connector changes in its herder; more requests at once only queue there.
        self._gate = asyncio.Semaphore(parallel)

    async def aclose(self) -> None:
        await self._http.close()

    async def _request(
        self, method: str, path: str, *, gated: bool = True, params: Any = None, json: Any = None
    ) -> Reply:
        metrics.CONNECT_CALLS.labels(redact(self.url, [])).inc()
        try:
            async with self._gate if gated else contextlib.nullcontext():
                started = time.monotonic()
                # Without a body aiohttp would declare application/octet-stream, which Connect refuses (415).
                skip = () if json is not None else ("Content-Type",)
                async with self._http.request(
                    method, f"{self.url}{path}", params=params, json=json, skip_auto_headers=skip
                ) as response:
                    reply = Reply(response.status, await response.read())
                log.debug(
                    "connect call",
                    extra={
                        "method": method,
                        "path": path,
                        "code": reply.status_code,
                        "seconds": round(time.monotonic() - started, 3),
                    },
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectUnreachable(redact(f"cannot reach Kafka Connect at {self.url}: {exc!r}", [])) from None
        if reply.status_code >= 400:
            raise error_from(self.url, reply)
        return reply

    async def list_expanded(self, *, configs: bool = True) -> dict[str, ConnectorView]:
        """Every connector with its status (and config), in ONE call.

        Configs are optional because Connect builds them at a cost that grows with the square of
        the number of connectors (about 0.13 s of its CPU for 500), while statuses are cheap.
        The listing does not queue behind calls waiting for the gate (a wave of creates): it is
        what reports the connectors that already run.
        """
        params = [("expand", "status"), ("expand", "info")] if configs else [("expand", "status")]
        response = await self._request("GET", "/connectors", gated=False, params=params)
        return {name: ConnectorView.from_listing(name, entry) for name, entry in response.json().items()}

    async def create(self, name: str, config: dict[str, str], initial_state: str) -> None:
        """Create the connector directly in its desired state.

        RUNNING is Connect's default and is not sent: an explicit initial state adds a target-state
        record to the config topic, which every worker then processes, and the herder of the
        leader makes creates one at a time.
        """
        body: dict[str, Any] = {"name": name, "config": config}
        if initial_state != "RUNNING":
            body["initial_state"] = initial_state
        await self._request("POST", "/connectors", json=body)

    async def config(self, name: str) -> dict[str, str]:
        """One connector's config as Connect stores it (strings, with name, class and tasks.max)."""
        return {k: str(v) for k, v in ((await self._request("GET", f"/connectors/{name}/config")).json() or {}).items()}

    async def put_config(self, name: str, config: dict[str, str]) -> None:
        await self._request("PUT", f"/connectors/{name}/config", json=config)

    async def set_state(self, name: str, state: str) -> None:
        verb = {"RUNNING": "resume", "PAUSED": "pause", "STOPPED": "stop"}[state]
        await self._request("PUT", f"/connectors/{name}/{verb}")

    async def restart(self, name: str, *, only_failed: bool) -> None:
        params = {"includeTasks": "true", "onlyFailed": "true" if only_failed else "false"}
        await self._request("POST", f"/connectors/{name}/restart", params=params)

    async def server_info(self) -> dict[str, Any]:
        """The worker's version, commit and Kafka cluster id (`GET /`)."""
        return dict((await self._request("GET", "/", gated=False)).json() or {})

    async def plugins(self) -> list[dict[str, str]]:
        """The installed connector plugins: class, type (source or sink) and version."""
        response = await self._request("GET", "/connector-plugins", gated=False)
        return [{k: str(p.get(k, "")) for k in ("class", "type", "version")} for p in response.json() or []]

    async def validate(self, connector_class: str, config: dict[str, str]) -> dict[str, Any]:
        """Connect's validation of a config (`error_count`, and per key its `errors`); nothing is changed."""
        path = f"/connector-plugins/{quote(connector_class, safe='')}/config/validate"
        return dict((await self._request("PUT", path, json=config)).json() or {})

    async def offsets(self, name: str) -> dict[str, Any]:
        """The connector's committed offsets (KIP-875): `{"offsets": [{"partition": …, "offset": …}]}`."""
        response = await self._request("GET", f"/connectors/{name}/offsets")
        return dict(response.json() or {"offsets": []})

    async def reset_offsets(self, name: str) -> str:
        """Forget every committed offset of a STOPPED connector; Connect's message says what it did."""
        response = await self._request("DELETE", f"/connectors/{name}/offsets")
        return str((response.json() or {}).get("message", ""))

    async def alter_offsets(self, name: str, offsets: dict[str, Any]) -> str:
        """Set the given partitions' offsets of a STOPPED connector (others are left as they are)."""
        response = await self._request("PATCH", f"/connectors/{name}/offsets", json=offsets)
        return str((response.json() or {}).get("message", ""))

    async def topics(self, name: str) -> list[str]:
        response = await self._request("GET", f"/connectors/{name}/topics")
        return sorted((response.json().get(name) or {}).get("topics") or [])

    async def delete(self, name: str) -> None:
        try:
            await self._request("DELETE", f"/connectors/{name}")
        except ConnectError as exc:
            if exc.status_code != 404:
                raise

    async def exists(self, name: str) -> bool:
        try:
            await self._request("GET", f"/connectors/{name}")
        except ConnectError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True
