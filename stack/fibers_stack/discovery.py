"""`python -m fibers_stack.discovery <prometheus home> <kubeconfig> <prometheus url>`: the stack's
Prometheus discovery loop (see `fibers_stack.prometheus`), as a process of its own that `fibers-stack
down` stops with the rest."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from fibers_stack.prometheus import discover

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    discover(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
