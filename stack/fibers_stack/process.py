"""Start, watch and stop the stack's server processes.

Each server runs in a session of its own, so stopping it also stops whatever it forked, and it
outlives the command that started it (`fibers-stack up` returns while the stack keeps running).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fibers_stack.network import NODE_IP


class StackError(RuntimeError):
    """A component did not start; the message carries the tail of its log."""


# Ports handed out are taken from below the kernel's ephemeral range (32768-60999 by default) and below
# Kubernetes' NodePorts (30000-32767): a port the kernel picked for `bind(0)` is also one it hands to the
# next outgoing connection, so a server started a moment later could find it taken. Here only a process
# that binds explicitly can collide, and the bind check below sees one that already has. (`_handed_out`
# keeps one process from handing a port out twice; two processes picking at once rely on the range's size.)
def _port_range() -> range:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(20000, min(30000, low)) if low > 21000 else range(20000, 30000)


_PORTS = _port_range()
_handed_out: set[int] = set()


def free_port(host: str = NODE_IP) -> int:
    """A port nothing listens on now, on `host` or any other address (servers given one bind the
    wildcard, some), that no outgoing connection will take meanwhile."""
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))  # refused if anything holds the port on any address
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise StackError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1} for {host}")


def port_open(port: int, host: str = NODE_IP) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def new_ca(directory: Path, subject: str) -> tuple[Path, Path]:
    """A throwaway certificate authority (30 days): its key and certificate, `ca.key` and `ca.crt`."""
    key, cert = directory / "ca.key", directory / "ca.crt"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        subject,
        "-keyout",
        str(key),
        "-out",
        str(cert),
    )
    return key, cert


def signed_cert(directory: Path, name: str, subject: str, ca: tuple[Path, Path], san: str = "") -> tuple[Path, Path]:
    """A key and a certificate `<name>.key`/`<name>.crt` signed by `ca` (key, cert), with a subjectAltName if given."""
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr))
    extra: list[str] = []
    if san:
        (directory / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", str(directory / f"{name}.ext")]
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[1]),
        "-CAkey",
        str(ca[0]),
        "-CAcreateserial",
        "-days",
        "30",
        *extra,
        "-out",
        str(cert),
    )
    return key, cert


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def spawn(
    argv: list[str],
    log_file: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start a detached server process writing to log_file; returns its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )
    return proc.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    return _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, IndexError):
        return "X"


def wait_until(ready: Callable[[], bool], *, name: str, pid: int, log_file: Path, timeout: float) -> None:
    """Poll ready() until true; fail fast with the log tail if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            raise StackError(f"{name} exited during start-up; last lines of {log_file}:\n{log_tail(log_file)}")
        try:
            if ready():
                return
        except Exception:  # a server that is still starting answers with all sorts of errors
            pass
        time.sleep(0.3)
    raise StackError(f"{name} not ready after {timeout:.0f}s; last lines of {log_file}:\n{log_tail(log_file)}")


def stop(pid: int, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Signal the process group, then kill it if it has not exited within the timeout."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
