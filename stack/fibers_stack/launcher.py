"""Bookkeeping for one stack start: where logs go and which processes were started."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fibers_stack import process


class Launcher:
    """Starts named servers under one run directory and remembers their pids, in start order."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        self.pids: dict[str, int] = {}
        self.commands: dict[str, dict[str, Any]] = {}  # enough to start a server again (tests stop/start them)
        self._lock = threading.Lock()

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def spawn(self, name: str, argv: list[str], *, user: str | None = None, env: dict[str, str] | None = None) -> int:
        pid = process.spawn(argv, self.log_file(name), user=user, env=env)
        with self._lock:
            self.pids[name] = pid
            self.commands[name] = {"argv": argv, "user": user, "env": env}
        return pid

    def wait(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        process.wait_until(ready, name=name, pid=self.pids[name], log_file=self.log_file(name), timeout=timeout)
