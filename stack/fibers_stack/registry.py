"""The stack's OCI registry: CNCF Distribution on the node IP, over TLS from a CA of the stack's own.

The node gets its images the way a cluster does: the stack pushes what `images` built (`buildah push`, the
digest it reports kept), and the kubelet pulls every pod's image from here by digest with
`imagePullPolicy: IfNotPresent` — containerd trusts the CA through its registry hosts directory
(`trust`). The chart is packaged and pushed as an OCI artifact (`push_chart`), and the demo and the tests
install it from `oci://…` as a user does.

The registry's storage lives in the cache, like buildah's layers, so a warm start pushes only what changed:
the registry already has every other blob, and buildah asks before it uploads. The CA and the server's
certificate are new at every start (the run directory is).
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from fibers_stack import fetch
from fibers_stack.launcher import Launcher
from fibers_stack.layout import REPO_ROOT, cache_dir
from fibers_stack.network import NODE_IP
from fibers_stack.process import free_port, new_ca, signed_cert

log = logging.getLogger("fibers_stack.registry")

CHART_REPOSITORY = "charts"  # oci://<registry>/charts/<chart name>, as Helm's own docs lay a registry out
FIBERS_CHART = REPO_ROOT / "charts" / "fibers"
START_TIMEOUT = 30  # seconds: the registry answers within a second here


@dataclass(frozen=True)
class Registry:
    """Where the registry is (`host:port`) and the CA its certificate is signed by."""

    host: str
    ca: Path

    @property
    def cert_dir(self) -> Path:
        """The CA alone in a folder: buildah's --cert-dir reads every *.crt in one."""
        return self.ca.parent / "trust"


def storage_dir() -> Path:
    """Blobs and manifests, kept across stacks: a warm push uploads only what changed."""
    return cache_dir() / "registry"


def start(launcher: Launcher) -> Registry:
    """Start the registry on a free port of the node IP and wait until it answers over TLS."""
    home = launcher.run_dir / "registry"
    home.mkdir(parents=True, exist_ok=True)
    ca = new_ca(home, "/CN=fibers-stack-registry-ca")
    key, cert = signed_cert(home, "server", f"/CN={NODE_IP}", ca, san=f"IP:{NODE_IP}")
    port = free_port()
    registry = Registry(host=f"{NODE_IP}:{port}", ca=ca[1])
    registry.cert_dir.mkdir(exist_ok=True)
    (registry.cert_dir / "ca.crt").write_bytes(ca[1].read_bytes())
    storage_dir().mkdir(parents=True, exist_ok=True)
    config = home / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "warn", "formatter": "text", "accesslog": {"disabled": True}},
                "storage": {"filesystem": {"rootdirectory": str(storage_dir())}, "delete": {"enabled": False}},
                "http": {"addr": registry.host, "tls": {"certificate": str(cert), "key": str(key)}},
            }
        )
    )
    # Distribution 3 sets up OpenTelemetry at start; with no collector here, exporting would only log errors.
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    launcher.spawn("registry", [str(fetch.registry()), "serve", str(config)], env=env)
    launcher.wait("registry", lambda: _answers(registry), timeout=START_TIMEOUT)
    return registry


def _answers(registry: Registry) -> bool:
    try:
        trust = ssl.create_default_context(cafile=str(registry.ca))
        return httpx.get(f"https://{registry.host}/v2/", verify=trust, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def trust(registry: Registry, hosts_dir: Path) -> None:
    """Make containerd trust the registry: a hosts.toml for it in containerd's registry config_path."""
    folder = hosts_dir / registry.host
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts.toml").write_text(
        f'server = "https://{registry.host}"\n\n'
        f'[host."https://{registry.host}"]\n'
        f'  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{registry.ca}"\n'
    )


def push_image(destination: str, local: str, name: str, tag: str, *, buildah: list[str], cert_dir: Path | None) -> str:
    """Push a built image (buildah's `local` reference) as <destination>/<name>:<tag>; its reference by digest.

    `destination` is a registry host, or a host and a path (registry.example.com/platform). `buildah` is the
    argv prefix that points buildah at the stack's storage (see `images`); `cert_dir` holds the CA a
    private registry's certificate is signed by. Credentials are buildah's own (`buildah login`).
    """
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        digest_file = Path(scratch) / "digest"
        trust = ["--cert-dir", str(cert_dir)] if cert_dir else []
        argv = [
            *buildah, "push", "--quiet", *trust, "--digestfile", str(digest_file),
            local, f"docker://{destination}/{name}:{tag}",
        ]  # fmt: skip
        _run(argv, f"pushing {local} to {destination}")
        digest = digest_file.read_text().strip()
    log.info("pushed %s", name, extra={"seconds": round(time.monotonic() - started, 1), "digest": digest})
    return f"{destination}/{name}:{tag}@{digest}"


def push_chart(destination: str, ca_file: Path | None, chart: Path = FIBERS_CHART) -> tuple[str, str]:
    """Package the chart and push it as an OCI artifact to <destination>/charts: the oci:// URL to install it
    from, and its version. Credentials are Helm's own (`helm registry login`).

    The stack pushes the version in Chart.yaml again whenever it starts or takes new images, so its registry
    serves the chart of the code as it is (a registry of releases would refuse to overwrite one).
    """
    helm = fetch.helm()
    version = str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])
    url = f"oci://{destination}/{CHART_REPOSITORY}"
    trust = ["--ca-file", str(ca_file)] if ca_file else []
    with tempfile.TemporaryDirectory() as scratch:
        _run([str(helm), "package", str(chart), "--destination", scratch], f"packaging {chart.name}")
        [package] = Path(scratch).glob("*.tgz")
        _run([str(helm), "push", str(package), url, *trust], f"pushing {package.name} to {url}")
    log.info("pushed the chart", extra={"chart": f"{url}/{chart.name}", "version": version})
    return f"{url}/{chart.name}", version


def chart_source(chart: str, version: str, ca_file: Path) -> list[str]:
    """The chart argument of `helm install`/`upgrade` for a chart pushed here, with the CA to trust."""
    return [chart, "--version", version, "--ca-file", str(ca_file)]


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed: {(result.stderr or result.stdout).strip()[-2000:]}")
