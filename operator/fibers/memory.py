"""Keeping the operator's resident memory close to what it really uses (glibc only; no-ops elsewhere).

Python frees objects into the C allocator, which keeps the pages for reuse. After a burst (500
resources created at once) the operator would keep its peak footprint for good, spread over one
malloc arena per worker thread. Fewer arenas and an explicit trim once things are quiet give the
pages back, so RSS and memory limits track the steady state rather than the peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("fibers.memory")
_M_ARENA_MAX = -8  # from glibc's malloc.h
_MIN_TRIM_INTERVAL = 30.0


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_libc = _glibc()
_last_trim = 0.0


def limit_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas; call before threads start (the same as MALLOC_ARENA_MAX)."""
    if _libc is not None:
        _libc.mallopt(_M_ARENA_MAX, arenas)


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS; at most every 30 s, as trimming walks the heap."""
    global _last_trim
    now = time.monotonic()
    if _libc is None or now - _last_trim < _MIN_TRIM_INTERVAL:
        return
    _last_trim = now
    _libc.malloc_trim(0)
    log.debug("free heap memory released")
