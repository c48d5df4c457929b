"""The Kubernetes API as Fibers calls it: a few REST calls with JSON bodies, on httpx.

Why not the official `kubernetes` package: importing it loads about 800 generated model classes,
about 17 MiB in every process that imports it (the operator, each consumer pod, each Spark driver),
for the dozen endpoints Fibers calls outside kopf (which has its own client). Objects are plain
dicts, as kopf hands them to handlers, so one shape serves both.

The client is synchronous and thread-safe; async code calls it in worker threads. Credentials come
from the pod's service account, else from the kubeconfig (`KUBECONFIG`, else `~/.kube/config`):
client certificates, a bearer token or token file, or an exec plugin (cloud logins).

Every failure reaches callers as `ApiError` (the server answered with an error) or `Unreachable` (no
usable answer, or no credentials to ask with), so their handling of those two covers everything.
`transient` and `retry_delay` say whether and when to try again.
"""

from __future__ import annotations

import atexit
import base64
import email.utils
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from fibers.redact import truncate

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # projected service-account tokens rotate; the file is read again this often
REQUEST_TIMEOUT = 60.0  # seconds; a call not answered by then is Unreachable (the API server is stuck)
WATCH_SECONDS = 300  # the API server ends a watch after this long; the watcher opens it again from where it was
EXEC_TIMEOUT = 60.0  # seconds; an exec plugin (a cloud login) still running by then is killed: Unreachable
EXEC_STDERR_CHARS = 300  # how much of a failed plugin's stderr its error quotes (never its stdout: a token's place)

# Retrying (`transient`, `retry_delay`). Statuses worth another try: overloaded (429), restarting or
# failing inside (500, 503), or a proxy in front of it that is (502, 504). A 409 is not among them: a
# conflict is resolved by the caller (read again, merge), not by waiting.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_BASE_SECONDS = 0.5  # the first wait without a Retry-After; it doubles with each attempt …
RETRY_CAP_SECONDS = 10.0  # … up to this, so a long outage is still tried a few times a minute
# A Retry-After is the server's own word on its load and is followed, up to this: a proxy's
# "come back in an hour" must not park a checkpoint or Lease write that long.
RETRY_AFTER_MAX_SECONDS = 60.0

MERGE_PATCH = "application/merge-patch+json"
# Lists and watches of metadata only (the API server's PartialObjectMetadata): a Secret's data never comes.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """The API server answered with an error status (404 not found, 409 conflict, …).

    `retry_after`: the seconds it asked the client to wait (a 429 or 503's Retry-After header, or its
    Status's `details.retryAfterSeconds`); None when it did not say.
    """

    def __init__(self, status: int, reason: str, body: str = "", retry_after: float | None = None) -> None:
        self.status, self.reason, self.body, self.retry_after = status, reason, body, retry_after
        super().__init__(f"{status} {reason}: {self.message}")

    @classmethod
    def of(cls, response: httpx.Response, body: str) -> ApiError:
        return cls(response.status_code, response.reason_phrase, body, _retry_after(response.headers, body))

    @property
    def message(self) -> str:
        """The API server's own message, else its reason."""
        try:
            return str(json.loads(self.body or "{}").get("message") or self.reason)
        except ValueError:
            return self.reason


class Unreachable(Exception):
    """No usable answer: connection refused or reset, TLS failure, timeout, an answer that is not JSON;
    or no credentials to ask with (a token file or exec plugin that fails)."""


def _retry_after(headers: httpx.Headers, body: str) -> float | None:
    """Seconds to wait, from a Retry-After header (seconds or an HTTP date) or a Kubernetes Status body."""
    if value := headers.get("Retry-After", "").strip():
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    try:
        seconds = (json.loads(body or "{}").get("details") or {}).get("retryAfterSeconds")
    except (ValueError, AttributeError):
        return None
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else None


def transient(exc: BaseException) -> bool:
    """Worth trying again as it is: no answer, or an answer saying the server is busy or restarting."""
    return isinstance(exc, Unreachable) or (isinstance(exc, ApiError) and exc.status in TRANSIENT_STATUSES)


def retry_delay(
    exc: BaseException, attempt: int, *, base: float = RETRY_BASE_SECONDS, cap: float = RETRY_CAP_SECONDS
) -> float:
    """Seconds before try `attempt + 1` (`attempt` counts from 0): the server's Retry-After when it gave one
    (up to RETRY_AFTER_MAX_SECONDS), else `base` doubled per attempt, never above `cap`."""
    if isinstance(exc, ApiError) and exc.retry_after is not None:
        return min(exc.retry_after, RETRY_AFTER_MAX_SECONDS)
    return float(min(cap, base * 2 ** min(attempt, 62)))  # the exponent bounded: no overflow on long outages


@dataclass(frozen=True)
class Config:
    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    exec_command: tuple[str, ...] = ()  # a kubeconfig exec plugin, run for a token
    exec_env: tuple[tuple[str, str], ...] = ()
    insecure: bool = False
    namespace: str = "default"  # the context's namespace (the pod's own, in a cluster)


def load() -> Config:
    """The pod's service account when running in a cluster, else the kubeconfig."""
    return in_cluster() or from_kubeconfig()


def in_cluster() -> Config | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (SERVICE_ACCOUNT / "token").exists():
        return None
    namespace_file = SERVICE_ACCOUNT / "namespace"
    return Config(
        server=f"https://{'[' + host + ']' if ':' in host else host}:{port}",
        ca_file=str(SERVICE_ACCOUNT / "ca.crt"),
        token_file=str(SERVICE_ACCOUNT / "token"),
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
    )


def from_kubeconfig(path: str | None = None, context: str | None = None) -> Config:
    """The current (or named) context of a kubeconfig; `*-data` fields are written to private files."""
    path = path or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or str(Path.home() / ".kube/config")
    doc = yaml.safe_load(Path(path).read_text()) or {}
    name = context or doc.get("current-context")

    def entry(section: str, key: str) -> dict[str, Any]:
        for item in doc.get(section) or []:
            if item.get("name") == key:
                return dict(item.get(section[:-1]) or {})
        raise ValueError(f"kubeconfig {path}: no {section[:-1]} named {key!r}")

    ctx = entry("contexts", str(name))
    cluster, user = entry("clusters", ctx["cluster"]), entry("users", ctx.get("user", ""))
    base = Path(path).parent

    def file(data_key: str, file_key: str, source: dict[str, Any]) -> str | None:
        if source.get(data_key):
            return _private_file(base64.b64decode(source[data_key]))
        if source.get(file_key):
            return str(base / os.path.expanduser(source[file_key]))
        return None

    exec_spec = user.get("exec") or {}
    return Config(
        server=str(cluster["server"]).rstrip("/"),
        ca_file=file("certificate-authority-data", "certificate-authority", cluster),
        cert_file=file("client-certificate-data", "client-certificate", user),
        key_file=file("client-key-data", "client-key", user),
        token=user.get("token"),
        token_file=user.get("tokenFile"),
        exec_command=tuple([exec_spec["command"], *(exec_spec.get("args") or [])]) if exec_spec else (),
        exec_env=tuple((e["name"], e["value"]) for e in exec_spec.get("env") or []),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        namespace=str(ctx.get("namespace") or "default"),
    )


_private_dir: str | None = None


def _private_file(content: bytes) -> str:
    """A file only this user can read (ssl loads certificates and keys from files), removed at exit: a
    client key must not outlive the process in /tmp."""
    global _private_dir
    if _private_dir is None:
        _private_dir = tempfile.mkdtemp(prefix="fibers-kube-")
        atexit.register(shutil.rmtree, _private_dir, True)
    fd, name = tempfile.mkstemp(dir=_private_dir)
    with os.fdopen(fd, "wb") as out:
        out.write(content)
    return name


def path(api: str, plural: str, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
    """A resource's URL path. `api` is "v1" (the core group) or "group/version", e.g. "apps/v1"."""
    parts = ["/api/v1" if api == "v1" else f"/apis/{api}"]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(quote(name, safe=""))
    if sub:
        parts.append(sub)
    return "/".join(parts)


def _json(content: str | bytes, response: httpx.Response) -> dict[str, Any]:
    """A JSON object from the API server. Anything else (a proxy's HTML page, a cut-off line) is no
    answer: Unreachable, saying what came but not repeating it (it may be a Secret's data)."""
    try:
        found = json.loads(content)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        kind = response.headers.get("Content-Type") or "no content type"
        where = response.request.url.path
        raise Unreachable(f"the answer to {where} is not a JSON object ({kind}, {len(content)} bytes)")
    return found


class Api:
    """Calls to one API server; JSON in, dicts out; errors as ApiError or Unreachable."""

    def __init__(self, config: Config | None = None, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.config = config or load()
        if self.config.insecure:
            verify: ssl.SSLContext | bool = False
        else:
            verify = ssl.create_default_context(cafile=self.config.ca_file)
            if self.config.cert_file:
                verify.load_cert_chain(self.config.cert_file, self.config.key_file)
        self._http = httpx.Client(
            base_url=self.config.server,
            verify=verify,
            timeout=timeout,
            headers={"Accept": "application/json", "User-Agent": "fibers"},
        )
        self._token, self._token_read = self.config.token, 0.0
        self._lock = threading.Lock()

    def _bearer(self) -> str | None:
        """The token to send; Unreachable when its file or plugin fails (tried again at the next call)."""
        with self._lock:
            stale = time.monotonic() - self._token_read > TOKEN_REREAD_SECONDS
            if self.config.token_file and stale:
                try:
                    self._token = Path(self.config.token_file).read_text().strip()
                except OSError as exc:
                    raise Unreachable(f"cannot read the token file {self.config.token_file}: {exc.strerror}") from None
                self._token_read = time.monotonic()
            elif self.config.exec_command and stale:
                self._token = self._exec_token()
                self._token_read = time.monotonic()
            return self._token

    def _exec_token(self) -> str:
        """Run the kubeconfig's exec plugin for a token. Its errors name the plugin and quote its stderr,
        never its stdout, which is where a token would be."""
        plugin = self.config.exec_command[0]
        env = {**os.environ, **dict(self.config.exec_env)}
        try:
            out = subprocess.run(
                self.config.exec_command, capture_output=True, text=True, env=env, timeout=EXEC_TIMEOUT
            )
        except (OSError, subprocess.SubprocessError) as exc:  # not installed, not executable, timed out
            raise Unreachable(f"exec plugin {plugin} did not run: {type(exc).__name__}") from None
        if out.returncode != 0:
            said = truncate(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "", EXEC_STDERR_CHARS)
            raise Unreachable(f"exec plugin {plugin} exited with {out.returncode}: {said or 'nothing on stderr'}")
        try:
            return str(json.loads(out.stdout)["status"]["token"])
        except (ValueError, TypeError, KeyError):
            raise Unreachable(f"exec plugin {plugin} printed no ExecCredential with status.token") from None

    def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        accept: str | None = None,
    ) -> dict[str, Any]:
        headers = self._auth({"Content-Type": content_type} if body is not None else {})
        if accept:
            headers["Accept"] = accept
        try:
            response = self._http.request(
                method,
                url,
                params=params,
                content=json.dumps(body) if body is not None else None,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError.of(response, response.text)
        return _json(response.content, response) if response.content else {}

    def _auth(self, headers: dict[str, str]) -> dict[str, str]:
        if token := self._bearer():
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def watch(
        self, url: str, *, resource_version: str, metadata_only: bool = False, **params: Any
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch from `resource_version` (bookmarks included) until the server ends it.

        Blocking: it is meant for a thread of its own. An `ERROR` event (410 Gone: the version is too
        old) is handed on like the others; the caller lists again. `metadata_only`: each object is its
        metadata (what a watch of Secrets needs, and all it may hold).
        """
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        timeout = httpx.Timeout(REQUEST_TIMEOUT, read=WATCH_SECONDS + REQUEST_TIMEOUT)
        try:
            headers = self._auth({"Accept": METADATA_WATCH} if metadata_only else {})
            with self._http.stream("GET", url, params=query, headers=headers, timeout=timeout) as response:
                if response.status_code >= 400:
                    raise ApiError.of(response, response.read().decode())
                for line in response.iter_lines():
                    if line:
                        yield _json(line, response)
        except httpx.TransportError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None

    def get(self, url: str, **params: Any) -> dict[str, Any]:
        return self.request("GET", url, params=params or None)

    def list_metadata(self, url: str, **params: Any) -> dict[str, Any]:
        """A list of the objects' metadata only (PartialObjectMetadataList)."""
        return self.request("GET", url, params=params or None, accept=METADATA_LIST)

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        try:
            return self.get(url)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, url: str, **params: Any) -> list[dict[str, Any]]:
        """A list's items (`labelSelector=…` and other query parameters as keywords)."""
        return list(self.get(url, **params).get("items") or [])

    def create(self, url: str, body: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return self.request("POST", url, body=body, timeout=timeout)

    def replace(self, url: str, body: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return self.request("PUT", url, body=body, timeout=timeout)

    def patch(self, url: str, patch: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
        """A dict is a merge patch, a list a JSON patch."""
        return self.request(
            "PATCH", url, body=patch, content_type=JSON_PATCH if isinstance(patch, list) else MERGE_PATCH
        )

    def delete(
        self, url: str, *, propagation: str | None = None, missing_ok: bool = True, uid: str | None = None
    ) -> None:
        """DELETE; `uid`: only if the object is still that one (a precondition: 409 otherwise)."""
        options: dict[str, Any] = {"propagationPolicy": propagation} if propagation else {}
        if uid:
            options["preconditions"] = {"uid": uid}
        body = {"kind": "DeleteOptions", "apiVersion": "v1", **options} if options else None
        try:
            self.request("DELETE", url, body=body)
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise
