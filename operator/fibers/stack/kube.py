"""Kubernetes control plane for the stack: etcd, kube-apiserver and kube-controller-manager.

The controller manager is what makes ownerReference garbage collection, namespace deletion and
Deployments/ReplicaSets work. There is no kubelet: pods never run (see the local executor).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from fibers.stack import fetch
from fibers.stack.launcher import Launcher
from fibers.stack.process import free_port

ADMIN_TOKEN = "fibers-stack-admin"  # loopback-only throwaway cluster: a static token is enough


def _http_ok(url: str, **kwargs: object) -> bool:
    return httpx.get(url, timeout=2, **kwargs).status_code == 200  # type: ignore[arg-type]


def _write_kubeconfig(path: Path, server: str, ca: Path) -> None:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: fibers-stack
  cluster: {{server: "{server}", certificate-authority: "{ca}"}}
users:
- name: admin
  user: {{token: {ADMIN_TOKEN}}}
contexts:
- name: fibers-stack
  context: {{cluster: fibers-stack, user: admin, namespace: default}}
current-context: fibers-stack
"""
    )


def start(launcher: Launcher) -> dict[str, str]:
    bins = fetch.kubernetes()
    home = launcher.run_dir / "kube"
    pki = home / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
        check=True,
        capture_output=True,
    )
    (home / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    launcher.spawn(
        "etcd",
        [
            str(bins / "etcd"),
            "--name=fibers",
            f"--data-dir={home / 'etcd'}",
            "--log-level=warn",
            "--unsafe-no-fsync",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=fibers=http://127.0.0.1:{peer_port}",
        ],
    )
    launcher.wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), timeout=30)

    server = f"https://127.0.0.1:{api_port}"
    launcher.spawn(
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={api_port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--token-auth-file={home / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--profiling=false",
        ],
    )
    launcher.wait("kube-apiserver", lambda: _http_ok(f"{server}/readyz", verify=False), timeout=90)

    kubeconfig = launcher.run_dir / "kubeconfig"
    _write_kubeconfig(kubeconfig, server, pki / "apiserver.crt")

    launcher.spawn(
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'apiserver.crt'}",
            "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle",
        ],
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    # The service-account controller creating `default` shows the controllers are running.
    launcher.wait(
        "kube-controller-manager",
        lambda: _http_ok(f"{server}/api/v1/namespaces/default/serviceaccounts/default", verify=False, headers=headers),
        timeout=60,
    )
    return {"kubeconfig": str(kubeconfig), "apiserver": server}
