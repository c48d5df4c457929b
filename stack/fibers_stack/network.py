"""The node's network: its address, the pod and service ranges, and the host changes they need.

Every address the stack uses lives here. The cluster is closed: servers bind to the node IP (an
address of this machine that no other host uses), pods live on their own bridge, and a guard chain
drops any pod traffic bound for an address outside the node and its pods, so nothing a test, a
benchmark or the demo starts can reach beyond this machine.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
from pathlib import Path

log = logging.getLogger("fibers_stack.network")

NODE_NAME = "fibers-node"
# The node's own address, on a port-less bridge: the kubelet refuses loopback, and the kernel here
# has no `dummy` link type. Not in use on these machines (eth0 is 192.0.2.2/24).
NODE_IP = "172.31.250.1"
NODE_LINK = "fibers-node0"
POD_CIDR = "10.244.0.0/24"
POD_BRIDGE = "fibers-cni0"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
CLUSTER_DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
GUARD_CHAIN = "FIBERS-GUARD"
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=check)


def _link_exists(name: str) -> bool:
    return _ip("link", "show", name, check=False).returncode == 0


def setup() -> None:
    """The node address, the sysctls pods need, and the guard chain (idempotent)."""
    if not Path("/proc/sys/net/bridge").exists():
        subprocess.run(["modprobe", "br_netfilter"], check=False, capture_output=True)
    for key, value in SYSCTLS.items():
        Path("/proc/sys", key).write_text(value)
    if not _link_exists(NODE_LINK):
        _ip("link", "add", NODE_LINK, "type", "bridge")
    if NODE_IP not in _ip("-o", "addr", "show", "dev", NODE_LINK).stdout:
        _ip("addr", "add", f"{NODE_IP}/32", "dev", NODE_LINK)
    _ip("link", "set", NODE_LINK, "up")
    _install_guard()


def _install_guard() -> None:
    """Pods may talk to each other, to services (rewritten to pods before FORWARD) and the node; nothing else."""
    if _iptables("-n", "-L", GUARD_CHAIN, check=False).returncode != 0:
        _iptables("-N", GUARD_CHAIN)
    _iptables("-F", GUARD_CHAIN)
    for destination in (POD_CIDR, NODE_IP):
        _iptables("-A", GUARD_CHAIN, "-d", destination, "-j", "RETURN")
    _iptables("-A", GUARD_CHAIN, "-j", "DROP")
    jump = ("FORWARD", "-s", POD_CIDR, "-j", GUARD_CHAIN)
    if _iptables("-C", *jump, check=False).returncode != 0:
        _iptables("-I", *jump)


def guard_drops() -> int:
    """Packets the guard chain dropped since it was installed (a test reads it: it should stay 0)."""
    out = _iptables("-n", "-v", "-x", "-L", GUARD_CHAIN, check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "DROP":
            return int(fields[0])
    return 0


def _chains(table: str) -> list[str]:
    out = _iptables("-t", table, "-S", check=False).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


def _owned(chain: str) -> bool:
    return chain == GUARD_CHAIN or chain.startswith(("KUBE-", "CNI-"))


def teardown() -> None:
    """Remove what setup() and the node's processes added to the host: links, chains, CNI state."""
    for link in (POD_BRIDGE, NODE_LINK):
        if _link_exists(link):
            _ip("link", "delete", link, check=False)
    # Jumps into our chains first (a chain still referenced cannot be deleted), then the chains.
    for table in ("filter", "nat", "mangle"):
        rules = _iptables("-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:
            parts = shlex.split(rule)  # the CNI plugin's rules carry quoted comments: "name: \"fibers\" id: …"
            if parts[:1] == ["-A"] and "-j" in parts and _owned(parts[parts.index("-j") + 1]) and not _owned(parts[1]):
                _iptables("-t", table, "-D", *parts[1:], check=False)
        owned = [c for c in _chains(table) if _owned(c)]
        for chain in owned:
            _iptables("-t", table, "-F", chain, check=False)
        for chain in owned:
            _iptables("-t", table, "-X", chain, check=False)
    with contextlib.suppress(FileNotFoundError):
        for leftover in Path("/var/lib/cni/networks").glob("fibers*"):
            subprocess.run(["rm", "-rf", str(leftover)], check=False)
    log.info("network torn down")


def leftovers() -> list[str]:
    """What of ours is still on the host (empty after a clean teardown); `stack status` and tests read it."""
    found = [f"link {name}" for name in (POD_BRIDGE, NODE_LINK) if _link_exists(name)]
    for table in ("filter", "nat", "mangle"):
        found += [f"iptables {table} {c}" for c in _chains(table) if _owned(c)]
    return found
