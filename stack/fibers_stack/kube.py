"""Kubernetes control plane for the stack: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The API server binds to the node IP, so pods reach it through the `kubernetes` Service (kube-proxy)
and the ServiceAccount admission plugin gives them tokens. The controller manager runs every
controller but the ones a cloud or a multi-node IPAM needs; its node lifecycle controller is what
takes the not-ready taint off the node once the kubelet reports Ready.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from fibers_stack import fetch
from fibers_stack.launcher import Launcher
from fibers_stack.network import NODE_IP, NODE_NAME, SERVICE_CIDR
from fibers_stack.process import free_port, new_ca, openssl, signed_cert

ADMIN_TOKEN = "fibers-stack-admin"  # a throwaway cluster closed to this machine: static tokens are enough
NODE_TOKEN = "fibers-stack-node"


def _http_ok(url: str, **kwargs: object) -> bool:
    return httpx.get(url, timeout=2, **kwargs).status_code == 200  # type: ignore[arg-type]


def _make_pki(pki: Path) -> None:
    """A CA for the kubelet to trust, the API server's client certificate for it, and the SA keys."""
    openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    ca = new_ca(pki, "/CN=fibers-stack-ca")
    signed_cert(pki, "kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", ca)


def write_kubeconfig(path: Path, server: str, ca: Path, token: str = ADMIN_TOKEN) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fibers-stack", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [
            {"name": "fibers-stack", "context": {"cluster": "fibers-stack", "user": "admin", "namespace": "default"}}
        ],
        "current-context": "fibers-stack",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


# What the API server records of each request (`audit.py` counts the operator's from it): who, from which
# client, which verb on what, at the Metadata level and once per request. The node's components, which
# call the most and are not ours, are left out; the controllers share the admin identity and are told
# apart by their user agent when the log is read.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:nodes"]},
        {"level": "None", "users": ["system:kube-proxy", "system:apiserver"]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version", "/openapi/*"]},
        {"level": "Metadata"},
    ],
}


def start(launcher: Launcher) -> dict[str, str]:
    bins = fetch.kubernetes()
    home = launcher.run_dir / "kube"
    pki = home / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    _make_pki(pki)
    (home / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},admin,admin,"system:masters"\n{NODE_TOKEN},system:node:{NODE_NAME},{NODE_NAME},"system:nodes"\n'
    )

    etcd_port, peer_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    api_port = free_port()
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

    server = f"https://{NODE_IP}:{api_port}"
    (home / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    audit_log = home / "audit.log"
    launcher.spawn(
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={NODE_IP}",
            f"--secure-port={api_port}",
            f"--advertise-address={NODE_IP}",
            f"--cert-dir={pki}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--token-auth-file={home / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
            f"--audit-policy-file={home / 'audit-policy.yaml'}",
            f"--audit-log-path={audit_log}",
            "--audit-log-mode=batch",  # written behind the requests, not in their way
            "--audit-log-maxsize=200",  # MB, then one older file is kept
            "--audit-log-maxbackup=1",
        ],
    )
    launcher.wait("kube-apiserver", lambda: _http_ok(f"{server}/readyz", verify=False), timeout=90)

    kubeconfig = launcher.run_dir / "kubeconfig"
    write_kubeconfig(kubeconfig, server, pki / "apiserver.crt")

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
            "--controllers=*,-nodeipam,-cloud-node-lifecycle",
        ],
    )
    launcher.spawn(
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port('127.0.0.1')}",
        ],
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    # The service-account controller creating `default` shows the controllers are running.
    launcher.wait(
        "kube-controller-manager",
        lambda: _http_ok(f"{server}/api/v1/namespaces/default/serviceaccounts/default", verify=False, headers=headers),
        timeout=60,
    )
    return {"kubeconfig": str(kubeconfig), "apiserver": server, "kube_pki": str(pki), "audit_log": str(audit_log)}
