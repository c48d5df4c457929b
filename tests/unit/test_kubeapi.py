"""fibers.kubeapi: kubeconfigs as kubectl writes them, URL paths, and faults (throttling, odd answers,
credentials that cannot be had) against a tiny HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from fibers import kubeapi
from fibers.kube import describe as kube_describe


def kubeconfig(tmp_path: Path, user: dict[str, object], namespace: str | None = None) -> Path:
    ctx: dict[str, object] = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "here",
        "contexts": [{"name": "other", "context": {"cluster": "x", "user": "x"}}, {"name": "here", "context": ctx}],
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_client_certificates_inline_become_private_files(tmp_path: Path) -> None:
    user = {
        "client-certificate-data": base64.b64encode(b"CERT").decode(),
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }
    config = kubeapi.from_kubeconfig(str(kubeconfig(tmp_path, user, namespace="shop")))
    assert config.server == "https://10.0.0.1:6443"
    assert config.ca_file == str(tmp_path / "ca.crt")  # relative to the kubeconfig, as kubectl reads it
    assert config.cert_file and Path(config.cert_file).read_bytes() == b"CERT"
    assert config.key_file and Path(config.key_file).read_bytes() == b"KEY"
    assert Path(config.key_file).stat().st_mode & 0o077 == 0, "only this user may read the key"
    assert config.namespace == "shop"


def test_a_token_from_an_exec_plugin(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os\n"
        "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': os.environ['GREETING'] + '-token'}}))\n"
    )
    user = {"exec": {"command": sys.executable, "args": [str(plugin)], "env": [{"name": "GREETING", "value": "hi"}]}}
    config = kubeapi.from_kubeconfig(str(kubeconfig(tmp_path, user)))
    assert config.namespace == "default"
    api = kubeapi.Api(kubeapi.Config(server=config.server, exec_command=config.exec_command, exec_env=config.exec_env))
    assert api._bearer() == "hi-token"


def test_paths_of_core_grouped_and_sub_resources() -> None:
    assert kubeapi.path("v1", "configmaps", "shop", "a-b") == "/api/v1/namespaces/shop/configmaps/a-b"
    assert kubeapi.path("apps/v1", "deployments", "shop") == "/apis/apps/v1/namespaces/shop/deployments"
    assert kubeapi.path("fibers.dev/v1beta1", "connectclusters", None, "x", "status") == (
        "/apis/fibers.dev/v1beta1/connectclusters/x/status"
    )


def test_api_errors_carry_the_servers_message() -> None:
    body = json.dumps({"kind": "Status", "message": 'configmaps "x" not found'})
    error = kubeapi.ApiError(404, "Not Found", body)
    assert error.status == 404 and error.message == 'configmaps "x" not found'
    assert kubeapi.ApiError(502, "Bad Gateway", "<html>").message == "Bad Gateway"


# ----- faults: a real HTTP server on 127.0.0.1, and credentials that cannot be had ----------------


class Answers:
    """A tiny API server: each GET answers with the next (status, headers, body) queued for its path."""

    def __init__(self) -> None:
        self.queued: dict[str, list[tuple[int, dict[str, str], bytes]]] = {}
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = answers.queued[self.path.split("?")[0]].pop(0)
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, path: str, status: int, body: object, **headers: str) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.queued.setdefault(path, []).append((status, {"Content-Type": "application/json", **headers}, raw))


@pytest.fixture
def answers() -> Iterator[Answers]:
    server = Answers()
    yield server
    server.server.shutdown()
    server.server.server_close()


STATUS_429 = {"kind": "Status", "code": 429, "message": "too many requests, please try again later"}


def test_429_carries_the_servers_retry_after_and_the_retry_waits_that_long(answers: Answers) -> None:
    answers.add("/api/v1/namespaces", 429, STATUS_429, **{"Retry-After": "2"})
    answers.add("/api/v1/namespaces", 503, {"kind": "Status", "code": 503})  # no Retry-After
    api = kubeapi.Api(kubeapi.Config(server=answers.url))
    with pytest.raises(kubeapi.ApiError) as throttled:
        api.get("/api/v1/namespaces")
    assert throttled.value.status == 429 and throttled.value.retry_after == 2.0
    assert kubeapi.transient(throttled.value)
    assert kubeapi.retry_delay(throttled.value, attempt=6) == 2.0  # the server's word, not the backoff
    with pytest.raises(kubeapi.ApiError) as unavailable:
        api.get("/api/v1/namespaces")
    assert unavailable.value.retry_after is None and kubeapi.transient(unavailable.value)
    delays = [kubeapi.retry_delay(unavailable.value, attempt) for attempt in range(8)]
    assert delays[0] == kubeapi.RETRY_BASE_SECONDS and delays == sorted(delays)  # grows …
    assert delays[-1] == kubeapi.RETRY_CAP_SECONDS  # … up to the cap
    assert kubeapi.retry_delay(unavailable.value, 3, base=1.0, cap=5.0) == 5.0


def test_retry_after_in_the_status_body_or_as_a_date_counts_too(answers: Answers) -> None:
    """The API server's own 429s and 500s name it in the Status's details; a proxy may send an HTTP date."""
    answers.add("/api/v1/pods", 500, {"kind": "Status", "code": 500, "details": {"retryAfterSeconds": 3}})
    answers.add("/api/v1/pods", 503, {}, **{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})  # long past
    api = kubeapi.Api(kubeapi.Config(server=answers.url))
    with pytest.raises(kubeapi.ApiError) as from_body:
        api.get("/api/v1/pods")
    assert from_body.value.retry_after == 3.0
    with pytest.raises(kubeapi.ApiError) as from_date:
        api.get("/api/v1/pods")
    assert from_date.value.retry_after == 0.0


def test_what_is_transient_and_what_callers_decide_themselves() -> None:
    assert kubeapi.transient(kubeapi.Unreachable("connection refused"))
    for status in (429, 500, 502, 503, 504):
        assert kubeapi.transient(kubeapi.ApiError(status, "x"))
    for status in (400, 403, 404, 409, 422):  # a conflict is the caller's to resolve (read again, merge)
        assert not kubeapi.transient(kubeapi.ApiError(status, "x"))
    assert not kubeapi.transient(ValueError("bug"))


def test_a_2xx_answer_that_is_not_json_is_no_answer(answers: Answers) -> None:
    """A proxy's HTML page with 200: callers handle Unreachable (retry), not a ValueError from deep inside."""
    answers.add("/api/v1/secrets", 200, b"<html>sign in</html>", **{"Content-Type": "text/html"})
    api = kubeapi.Api(kubeapi.Config(server=answers.url))
    with pytest.raises(kubeapi.Unreachable) as caught:
        api.get("/api/v1/secrets")
    assert "sign in" not in str(caught.value)  # a body is never repeated: it may be a Secret's


def test_a_token_file_that_cannot_be_read_is_unreachable(answers: Answers, tmp_path: Path) -> None:
    api = kubeapi.Api(kubeapi.Config(server=answers.url, token_file=str(tmp_path / "gone")))
    with pytest.raises(kubeapi.Unreachable) as caught:
        api.get("/api/v1/namespaces")
    assert "token" in str(caught.value)


TOKEN = "sha256~s3cr3t-t0ken"


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (f"import sys; print({TOKEN!r}); print('not logged in', file=sys.stderr); sys.exit(1)", "not logged in"),
        (f"print('token: {TOKEN}')", "ExecCredential"),  # exits 0, but its output is no ExecCredential
        (f"import json; print(json.dumps({{'status': {{'tokn': {TOKEN!r}}}}}))", "ExecCredential"),
    ],
    ids=["exits-1", "not-json", "no-token"],
)
def test_an_exec_plugin_that_fails_is_unreachable_and_its_output_stays_out(
    answers: Answers, tmp_path: Path, script: str, said: str
) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(script)
    api = kubeapi.Api(kubeapi.Config(server=answers.url, exec_command=(sys.executable, str(plugin))))
    with pytest.raises(kubeapi.Unreachable) as caught:
        api.get("/api/v1/namespaces")
    assert said in str(caught.value)
    assert TOKEN not in str(caught.value) and TOKEN not in kube_describe(caught.value)


def test_an_exec_plugin_that_is_not_installed_is_unreachable(answers: Answers, tmp_path: Path) -> None:
    api = kubeapi.Api(kubeapi.Config(server=answers.url, exec_command=(str(tmp_path / "gke-gcloud-auth-plugin"),)))
    with pytest.raises(kubeapi.Unreachable) as caught:
        api.get("/api/v1/namespaces")
    assert "gke-gcloud-auth-plugin" in str(caught.value)


def test_key_files_written_for_ssl_are_removed_at_exit(tmp_path: Path) -> None:
    """A kubeconfig's inline client key goes to a private file for ssl; it must not outlive the process."""
    script = "from fibers import kubeapi; print(kubeapi._private_file(b'-----BEGIN PRIVATE KEY-----'))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    written = Path(result.stdout.strip())
    assert written.name and not written.exists() and not written.parent.exists()
