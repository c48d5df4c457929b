"""What an image build reads, and the tag it gets: a short hash of all of it.

A tag names exactly one build's inputs — the Dockerfile, every file its COPY and ADD instructions read,
the build arguments — so a changed input is a new tag and a tag is never a stale image (`images`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

TAG_LENGTH = 12


def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, one string each: comments dropped, continuation lines joined."""
    result: list[str] = []
    current = ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction is not part of it
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        result.append((current + stripped).strip())
        current = ""
    if current.strip():
        result.append(current.strip())
    return result


def copied_sources(dockerfile: str) -> list[str]:
    """The build-context paths the Dockerfile's COPY and ADD instructions read (not those --from a stage)."""
    sources: list[str] = []
    for instruction in _instructions(dockerfile):
        keyword, _, rest = instruction.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags):
            continue
        paths = [w for w in words if not w.startswith("--")]
        if paths and paths[0].startswith("["):  # the JSON form: COPY ["src", …, "dest"]
            paths = json.loads(rest[rest.index("[") :])
        sources.extend(p.rstrip("/") or "." for p in paths[:-1])
    return sources


def _ignored(path: Path) -> bool:
    """Build leftovers that never matter to an image (.dockerignore keeps most of them out too)."""
    return any(part == "__pycache__" or part.endswith((".egg-info", ".pyc")) for part in path.parts)


def context_files(context: Path, sources: Iterable[str]) -> list[Path]:
    """Every file under the given context paths, sorted; a missing path is an error (the build would fail)."""
    files: set[Path] = set()
    for source in sources:
        path = context / source
        if path.is_dir():
            files.update(p for p in path.rglob("*") if p.is_file() and not _ignored(p.relative_to(context)))
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"{path}: copied into an image but missing")
    return sorted(files)


def inputs_hash(files: Iterable[Path], extra: Mapping[str, str], root: Path) -> str:
    """A short hash of the files' names (relative to root) and contents and of the extra key/values."""
    digest = hashlib.sha256()
    for key in sorted(extra):
        digest.update(f"{key}={extra[key]}\0".encode())
    for path in sorted(files):
        name = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()[:TAG_LENGTH]


def dockerfile_tag(dockerfile: Path, context: Path, extra: Mapping[str, str]) -> str:
    """The tag of an image built from this Dockerfile: the Dockerfile, .dockerignore, every file it COPYs."""
    files = context_files(context, copied_sources(dockerfile.read_text()))
    files += [p for p in (dockerfile, context / ".dockerignore") if p.is_file()]
    return inputs_hash(files, extra, context)
