"""A real server behind a small HTTP proxy the test steers: faults wrap the real thing, never replace it."""

from __future__ import annotations

import threading
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.integration.conftest import free_port


class ForwardingProxy:
    """Forwards every request to `upstream` and its answer back, unless `intercept` answers it first
    (a subclass's fault: a refusal, a delay). Serves on 127.0.0.1, each request in its own thread."""

    content_type = "application/json"

    def __init__(self, upstream: str) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                intercepted = proxy.intercept(self.command, self.path, self.headers)
                if intercepted is not None:
                    self._reply(*intercepted)
                    return
                forwarded = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "content-type")}
                answer = httpx.request(self.command, upstream + self.path, content=body, headers=forwarded, timeout=60)
                self._reply(*proxy.answered(self.command, self.path, answer.status_code, answer.content))

            def _reply(self, status: int, content: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", proxy.content_type)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def intercept(self, method: str, path: str, headers: HTTPMessage) -> tuple[int, bytes] | None:
        """An answer of the proxy's own instead of the upstream's; None forwards the request (`headers`
        are looked up without regard to case)."""
        return None

    def answered(self, method: str, path: str, status: int, content: bytes) -> tuple[int, bytes]:
        """What the client hears of the upstream's answer (a subclass's fault: an answer lost after the
        upstream acted on the request); the answer itself by default."""
        return status, content

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
