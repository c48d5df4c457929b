"""The node: containerd (with runc and the CNI bridge), the kubelet and kube-proxy.

Everything here was found to need exactly these settings on the project machines (root in a VM,
cgroup v1, PID 1 not systemd, no CAP_SYS_RESOURCE); `shared/notes/real-node.md` explains each:
the cgroupfs driver everywhere, `failCgroupV1: false`, `restrict_oom_score_adj`, no AppArmor, and a
node IP that is not loopback. Images are pulled from the stack's registry, which containerd trusts
through its registry hosts directory (`registry_hosts_dir`).

containerd's root (its image store) lives in the cache, so images survive `stack down`; everything
else (state, sockets, the kubelet's pods and logs, CNI leases) lives in the run directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
from pathlib import Path

import httpx

from fibers_stack import fetch
from fibers_stack.kube import ADMIN_TOKEN, NODE_TOKEN, write_kubeconfig
from fibers_stack.launcher import Launcher
from fibers_stack.layout import cache_dir
from fibers_stack.network import (
    CLUSTER_DNS_IP,
    CLUSTER_DOMAIN,
    NODE_IP,
    NODE_NAME,
    POD_BRIDGE,
    POD_CIDR,
)
from fibers_stack.process import free_port

log = logging.getLogger("fibers_stack.node")

CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
CONTAINERD_NAMESPACE = "k8s.io"  # where the CRI plugin keeps images and containers
# Host paths the kubelet and containerd use whatever their configuration says; `down` clears them.
HOST_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd")


def containerd_root() -> Path:
    return cache_dir() / "containerd"


# What containerd's CRI plugin logs as the last step of its start, right before it serves the kubelet.
CRI_STARTED = b"Start streaming server"


def containerd_socket(run_dir: Path) -> Path:
    return run_dir / "containerd" / "containerd.sock"


def registry_hosts_dir(run_dir: Path) -> Path:
    """containerd's registry config_path: one <host:port>/hosts.toml per registry it trusts (`registry.trust`)."""
    return run_dir / "containerd" / "certs.d"


def _containerd_config(run_dir: Path, pause_image: str) -> Path:
    home = run_dir / "containerd"
    registry_hosts_dir(run_dir).mkdir(parents=True, exist_ok=True)
    (home / "state").mkdir(parents=True, exist_ok=True)
    cni_conf = run_dir / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-fibers.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "fibers",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": POD_BRIDGE,
                        "isGateway": True,
                        "ipMasq": True,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(run_dir / "cni" / "ipam"),
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=2,
        )
    )
    config = home / "config.toml"
    config.write_text(
        f"""version = 2
root = "{containerd_root()}"
state = "{home / "state"}"
# opt would create /opt/containerd; the others are snapshotters this machine has no use for.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{containerd_socket(run_dir)}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{registry_hosts_dir(run_dir)}"
"""
    )
    return config


def ctr(run_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ctr", "--address", str(containerd_socket(run_dir)), "-n", CONTAINERD_NAMESPACE, *args]
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def start_containerd(launcher: Launcher, pause_image: str) -> str:
    """Start containerd and clear what an earlier stack left in its persistent store."""
    config = _containerd_config(launcher.run_dir, pause_image)
    containerd_root().mkdir(parents=True, exist_ok=True)
    log_file = launcher.log_file("containerd")
    logged_before = log_file.stat().st_size if log_file.exists() else 0  # the log is appended to across starts
    launcher.spawn("containerd", ["containerd", "--config", str(config)])

    def ready() -> bool:
        # Its API answers before its CRI plugin has finished starting; a kubelet started in that gap exits
        # ("server is not initialized yet", met on a stack start). The plugin logs this line, then serves.
        with open(log_file, "rb") as log:
            log.seek(logged_before)
            started = CRI_STARTED in log.read()
        return started and ctr(launcher.run_dir, "version", check=False).returncode == 0

    launcher.wait("containerd", ready, timeout=30)
    remove_containers(launcher.run_dir)
    _remove_imported_images(launcher.run_dir)
    return str(containerd_socket(launcher.run_dir))


def _remove_imported_images(run_dir: Path) -> None:
    """Images an earlier stack imported with `ctr import` (named localhost/…): pods now pull from the registry."""
    imported = [
        ref for ref in ctr(run_dir, "images", "ls", "-q", check=False).stdout.split() if ref.startswith("localhost/")
    ]
    if imported:
        ctr(run_dir, "images", "rm", *imported, check=False)


def remove_containers(run_dir: Path) -> None:
    """Kill and remove every container in containerd's CRI namespace (sandboxes included)."""
    ids = ctr(run_dir, "containers", "list", "-q", check=False).stdout.split()
    for cid in ids:
        ctr(run_dir, "tasks", "kill", "-s", "SIGKILL", cid, check=False)
    deadline = time.monotonic() + 10
    while ids and time.monotonic() < deadline:
        running = ctr(run_dir, "tasks", "list", "-q", check=False).stdout.split()
        if not running:
            break
        for cid in running:
            ctr(run_dir, "tasks", "delete", "-f", cid, check=False)
        time.sleep(0.2)
    for cid in ids:
        ctr(run_dir, "containers", "delete", cid, check=False)


def _kubelet_config(run_dir: Path, pki: Path, kubelet_port: int) -> Path:
    home = run_dir / "kubelet"
    home.mkdir(parents=True, exist_ok=True)
    # dnsPolicy: Default pods (CoreDNS itself) get this file: no upstream resolver, the cluster stays closed.
    (home / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    config = home / "config.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": NODE_IP,
                "port": kubelet_port,
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": 0,
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": False},
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                },
                "authorization": {"mode": "AlwaysAllow"},
                "cgroupDriver": "cgroupfs",
                "failCgroupV1": False,
                "failSwapOn": False,
                "containerRuntimeEndpoint": f"unix://{containerd_socket(run_dir)}",
                "clusterDNS": [CLUSTER_DNS_IP],
                "clusterDomain": CLUSTER_DOMAIN,
                "resolvConf": str(home / "resolv.conf"),
                "podLogsDir": str(run_dir / "pod-logs"),
                "podCIDR": POD_CIDR,
                "registerNode": True,
                # Never evict for disk or collect images: the node only has the images we imported.
                "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "serializeImagePulls": False,
                "shutdownGracePeriod": "0s",
            },
            indent=2,
        )
    )
    return config


def start_kubelet(launcher: Launcher, apiserver: str, pki: Path) -> None:
    bins = fetch.kubernetes()
    home = launcher.run_dir / "kubelet"
    config = _kubelet_config(launcher.run_dir, pki, free_port())
    kubeconfig = home / "kubeconfig"
    write_kubeconfig(kubeconfig, apiserver, pki / "apiserver.crt", NODE_TOKEN)
    launcher.spawn(
        "kubelet",
        [
            str(bins / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={home / 'root'}",
            f"--cert-dir={home / 'pki'}",
            f"--node-ip={NODE_IP}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ],
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    url = f"{apiserver}/api/v1/nodes/{NODE_NAME}"

    def ready() -> bool:
        node = httpx.get(url, headers=headers, verify=False, timeout=2).json()
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])
        )
        return ready and not (node.get("spec") or {}).get("taints")

    launcher.wait("kubelet", ready, timeout=120)


def start_kube_proxy(launcher: Launcher, kubeconfig: str) -> None:
    bins = fetch.kubernetes()
    config = launcher.run_dir / "kube-proxy.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "clientConnection": {"kubeconfig": kubeconfig},
                "mode": "iptables",
                "clusterCIDR": POD_CIDR,
                "hostnameOverride": NODE_NAME,
                "bindAddress": NODE_IP,
                "healthzBindAddress": f"127.0.0.1:{free_port('127.0.0.1')}",
                "metricsBindAddress": f"127.0.0.1:{free_port('127.0.0.1')}",
                "nodePortAddresses": [f"{NODE_IP}/32"],
                # 0: leave the host's conntrack table size and timeouts as they are.
                "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            }
        )
    )
    launcher.spawn("kube-proxy", [str(bins / "kube-proxy"), f"--config={config}", "--v=1"])
    # Ready once its rules for the `kubernetes` Service exist.
    launcher.wait(
        "kube-proxy",
        lambda: (
            "KUBE-SERVICES"
            in subprocess.run(
                ["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"], capture_output=True, text=True
            ).stdout
            and "default/kubernetes"
            in subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout
        ),
        timeout=60,
    )


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefixes):
            mounts.append(target)
    return sorted(mounts, key=len, reverse=True)  # innermost first


def unmount_all(run_dir: Path) -> None:
    """Unmount what the kubelet and containerd left mounted (volumes, sandboxes' shm, rootfs)."""
    prefixes = (str(run_dir) + "/", str(containerd_root()) + "/", *(p + "/" for p in HOST_PATHS))
    for target in _mounts_under(prefixes):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def leftover_mounts(run_dir: Path) -> list[str]:
    return _mounts_under((str(run_dir) + "/", str(containerd_root()) + "/", *(p + "/" for p in HOST_PATHS)))


KUBEPODS = "kubepods"


def remove_cgroups() -> None:
    """The kubelet's cgroups (cgroupfs driver): innermost first; only empty ones can go, as intended."""
    root = Path("/sys/fs/cgroup")
    for controller in root.iterdir():
        top = controller / KUBEPODS
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def leftover_cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    return [str(c / KUBEPODS) for c in root.iterdir() if (c / KUBEPODS).is_dir()] if root.is_dir() else []


def clear_host_paths() -> None:
    for path in HOST_PATHS:
        with contextlib.suppress(FileNotFoundError):
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, capture_output=True)
    # libcni caches each attachment's result here, whatever the configuration says; ours are "fibers-…".
    cni = Path("/var/lib/cni")
    for cached in cni.glob("results/fibers-*"):
        cached.unlink(missing_ok=True)
    for empty in (cni / "results", cni):
        with contextlib.suppress(OSError):
            empty.rmdir()
