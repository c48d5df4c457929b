"""Python as the operator and job images have it: without the `kubernetes` package.

The development environment installs `kubernetes` for the tests and the local stack; the images do
not (fibers.kubeapi speaks to the API server). With this directory first on PYTHONPATH, importing
`kubernetes` fails in that process as it would in the images, so the tests prove the operator runs
without it, and the benchmarks measure the memory it has there (kopf imports the package whenever
it can, ~17 MiB).
"""

from __future__ import annotations

import importlib.abc
import sys


class _NoKubernetes(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "kubernetes" or name.startswith("kubernetes."):
            raise ImportError(f"No module named {name!r} (as in the Fibers images)")
        return None


sys.meta_path.insert(0, _NoKubernetes())
