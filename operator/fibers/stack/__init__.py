"""The local stack: real Kubernetes, Kafka + Connect, PostgreSQL, FerretDB and Spark jars on loopback.

Test and demo infrastructure only. `up()` starts what is missing and records endpoints and pids in
<run dir>/stack.json; `down()` stops every process it started.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fibers.stack import ferretdb, fetch, kafka, kube, postgres, process
from fibers.stack.launcher import Launcher
from fibers.stack.layout import run_dir

log = logging.getLogger("fibers.stack")

# Started in parallel; each starts its own processes in order.
COMPONENTS: dict[str, Callable[[Launcher], dict[str, str]]] = {
    "kubernetes": kube.start,
    "kafka": kafka.start,
    "postgres": postgres.start,
    "ferretdb": ferretdb.start,
}
STOP_SIGNALS = {"postgres": signal.SIGINT}  # SIGINT is PostgreSQL's fast shutdown


@dataclass
class StackInfo:
    run_dir: str
    kubeconfig: str = ""
    apiserver: str = ""
    kafka_bootstrap: str = ""
    connect_url: str = ""
    postgres_dsn: str = ""
    mongodb_uri: str = ""
    spark_kafka_jars: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return Path(self.run_dir) / "logs"

    def env(self) -> dict[str, str]:
        """Environment variables that point clients (kubectl, jobs, the operator) at this stack."""
        return {
            "KUBECONFIG": self.kubeconfig,
            "FIBERS_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "FIBERS_CONNECT_URL": self.connect_url,
            "FIBERS_POSTGRES_DSN": self.postgres_dsn,
            "FIBERS_MONGODB_URI": self.mongodb_uri,
            "FIBERS_SPARK_KAFKA_JARS": self.spark_kafka_jars,
        }

    def dead(self) -> list[str]:
        return [name for name, pid in self.pids.items() if not process.alive(pid)]


def _state_file() -> Path:
    return run_dir() / "stack.json"


def current() -> StackInfo | None:
    """The recorded stack, if any (running or not)."""
    try:
        return StackInfo(**json.loads(_state_file().read_text()))
    except FileNotFoundError:
        return None


def up() -> StackInfo:
    """Start the whole stack, or return the running one."""
    running = current()
    if running and running.pids and not running.dead():
        log.info("stack already running", extra={"run_dir": running.run_dir})
        return running
    if running:
        down()
    fetch.fetch_all()  # builds happen here, once, before any server starts

    root = run_dir()
    shutil.rmtree(root, ignore_errors=True)  # every start is a fresh cluster
    root.mkdir(parents=True)
    root.chmod(0o755)
    launcher = Launcher(root)
    info = StackInfo(run_dir=str(root), spark_kafka_jars=str(fetch.spark_kafka_jars()))
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(len(COMPONENTS)) as pool:
            futures = {name: pool.submit(start, launcher) for name, start in COMPONENTS.items()}
            for name, future in futures.items():
                for key, value in future.result().items():
                    setattr(info, key, value)
                log.info("%s ready", name)
        _start_local_executor(launcher, info)
    except BaseException:
        info.pids = dict(launcher.pids)
        _stop_all(info)
        raise
    info.pids = dict(launcher.pids)
    info.commands = dict(launcher.commands)
    _save(info)
    log.info("stack up", extra={"seconds": round(time.monotonic() - started, 1), "logs": str(info.log_dir)})
    return info


def _start_local_executor(launcher: Launcher, info: StackInfo) -> None:
    """Our stand-in for the Spark Operator's controller; ready once its CRD is served."""
    import httpx

    argv = [
        sys.executable,
        "-m",
        "fibers.stack.local_executor",
        "--kubeconfig",
        info.kubeconfig,
        "--log-dir",
        str(info.log_dir),
    ]
    launcher.spawn("local-executor", argv, env=info.env())
    url = f"{info.apiserver}/apis/sparkoperator.k8s.io/v1beta2"
    headers = {"Authorization": f"Bearer {kube.ADMIN_TOKEN}"}
    launcher.wait(
        "local-executor",
        lambda: httpx.get(url, headers=headers, verify=False, timeout=2).status_code == 200,
        timeout=60,
    )
    log.info("local-executor ready")


def _save(info: StackInfo) -> None:
    _state_file().write_text(json.dumps(asdict(info), indent=2))


def adopt_process(name: str, pid: int, argv: list[str]) -> None:
    """Record a process started next to the stack (the demo's operator) so `down` stops it too."""
    info = current()
    if info is None:
        raise RuntimeError("no stack is running")
    if name in info.pids and process.alive(info.pids[name]):
        process.stop(info.pids[name])
    info.pids[name] = pid
    info.commands[name] = {"argv": argv, "user": None, "env": None}
    _save(info)


def stop_component(name: str) -> None:
    """Stop one server of the running stack (tests use this to see the operator cope)."""
    info = current()
    if info is None or name not in info.pids:
        raise KeyError(f"no running stack component {name!r}")
    process.stop(info.pids[name], STOP_SIGNALS.get(name, signal.SIGTERM))


def start_component(name: str, ready: Callable[[], bool], timeout: float = 120) -> None:
    """Start a stopped server again with the same command line, ports and data."""
    info = current()
    if info is None or name not in info.commands:
        raise KeyError(f"no stack component {name!r}")
    launcher = Launcher(Path(info.run_dir))
    command = info.commands[name]
    launcher.spawn(name, command["argv"], user=command.get("user"), env=command.get("env"))
    launcher.wait(name, ready, timeout)
    info.pids[name] = launcher.pids[name]
    _save(info)


def _stop_all(info: StackInfo) -> None:
    for name, pid in reversed(list(info.pids.items())):
        process.stop(pid, STOP_SIGNALS.get(name, signal.SIGTERM))


def down() -> None:
    """Stop every recorded process and remove the run directory's data (logs are kept)."""
    info = current()
    if info is None:
        return
    _stop_all(info)
    root = Path(info.run_dir)
    for child in root.iterdir():
        if child.name != "logs":
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink()
    log.info("stack down", extra={"run_dir": str(root)})
