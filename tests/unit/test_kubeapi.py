"""fibers.kubeapi without a server: kubeconfigs as kubectl writes them, and URL paths."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import yaml

from fibers import kubeapi


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
    assert kubeapi.path("fibers.dev/v1alpha1", "connectclusters", None, "x", "status") == (
        "/apis/fibers.dev/v1alpha1/connectclusters/x/status"
    )


def test_api_errors_carry_the_servers_message() -> None:
    body = json.dumps({"kind": "Status", "message": 'configmaps "x" not found'})
    error = kubeapi.ApiError(404, "Not Found", body)
    assert error.status == 404 and error.message == 'configmaps "x" not found'
    assert kubeapi.ApiError(502, "Bad Gateway", "<html>").message == "Bad Gateway"
