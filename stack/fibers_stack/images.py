"""The container images the node runs, built here with buildah and pushed to the stack's registry.

There is no Docker engine on these machines and no registry to pull from, so every image starts from
something made here: a Debian bookworm `base` from debootstrap, then the repository's Dockerfile
(`fibers` = its operator target, `fibers-job` = its job target), the Spark Operator on top of the job
image (tools/spark-operator/Containerfile), and `pause` and `coredns` from scratch around the static
binaries `fetch` builds.

Each image is tagged with a hash of everything its build reads (the Dockerfile and every file it COPYs,
the binaries, the parent image's tag), so a changed input is a new tag, never a stale image under an old
name. A finished build is the archive `<cache>/images/<name>-<tag>.tar` (written under a temporary name
and renamed); buildah's own storage, also in the cache, keeps the layers, so editing operator/ rebuilds
only the small layer with the fibers wheel. `publish` pushes the images to the stack's OCI registry
(`fibers_stack.registry`), from which the kubelet pulls them by digest, as a cluster pulls a user's.

Builds use the host's network (Debian over plain http, PyPI and Maven Central over https) and never
pull. pip and Maven need this machine's CA certificates to reach PyPI and Maven Central; they get them
as read-only build-time mounts and build arguments (PIP_CERT, MAVEN_OPTS), never as a file in an image.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fibers_stack import fetch
from fibers_stack.build_inputs import TAG_LENGTH, dockerfile_tag, inputs_hash
from fibers_stack.layout import REPO_ROOT, cache_dir, tools_dir
from fibers_stack.process import log_tail
from fibers_stack.registry import Registry, push_image

log = logging.getLogger("fibers_stack.images")

DEBIAN_SUITE = "bookworm"  # what the Dockerfile's default debian:bookworm-slim is
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # this machine's CAs, for pip in the builds
JAVA_TRUSTSTORE = Path("/etc/ssl/certs/java/cacerts")  # the same for Maven

# What `debian:bookworm-slim` does to a debootstrap tree, so that images built on our base are the size
# a user's `docker build` gives: no docs, man pages or translations in later installs, and apt leaves no
# .deb files behind (the Dockerfile only removes the package lists).
DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
"""
_APT_CLEAN_CMD = "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || :"
APT_CLEAN = f"""\
DPkg::Post-Invoke {{ "{_APT_CLEAN_CMD}"; }};
APT::Update::Post-Invoke {{ "{_APT_CLEAN_CMD}"; }};
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""
BASE_CONTAINERFILE = 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n'
# The spark-sql-kafka jars are fetched in the Dockerfile by a Maven stage (MAVEN_IMAGE); the official
# maven image is not reachable here, Debian's maven on our base is.
MAVEN_CONTAINERFILE = """\
FROM {base}
ARG DEBIAN_FRONTEND=noninteractive
RUN mkdir -p /usr/share/man/man1 && apt-get update && apt-get install -y --no-install-recommends maven \\
 && rm -rf /var/lib/apt/lists/*
"""
# 65535 is the user of the upstream pause image.
PAUSE_CONTAINERFILE = 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
# CoreDNS listens on an unprivileged port in its pod (see coredns.py), so it needs no capability.
COREDNS_CONTAINERFILE = 'FROM scratch\nCOPY coredns /coredns\nUSER 65534:65534\nENTRYPOINT ["/coredns"]\n'

# Kueue's chart runs /manager as a non-root user with a read-only root filesystem (its certificates
# are a mounted Secret): the static binary is all the image needs.
KUEUE_CONTAINERFILE = 'FROM scratch\nCOPY manager /manager\nUSER 65532:65532\nENTRYPOINT ["/manager"]\n'


@dataclass(frozen=True)
class Images:
    """Full references (localhost/<name>:<input hash>) of the images built here."""

    base: str
    operator: str
    job: str
    spark_operator: str
    pause: str
    coredns: str

    def refs(self) -> dict[str, str]:
        """The images the node runs, by role (stack.json's `images`), pause first: containerd needs it first."""
        return {
            "pause": self.pause,
            "coredns": self.coredns,
            "spark-operator": self.spark_operator,
            "job": self.job,
            "operator": self.operator,
        }


def images_dir() -> Path:
    """The archives (one per image and tag) and the temporary build contexts."""
    return cache_dir() / "images"


def archive_path(ref: str) -> Path:
    """localhost/<name>:<tag> → <cache>/images/<name>-<tag>.tar"""
    name, tag = _split(ref)
    return images_dir() / f"{name}-{tag}.tar"


def _split(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    return repository.removeprefix("localhost/"), tag


def _ref(name: str, tag: str) -> str:
    return f"localhost/{name}:{tag}"


# ---- buildah -----------------------------------------------------------------------------------------


def _storage_dir() -> Path:
    return cache_dir() / "buildah"


def _storage_driver() -> str:
    """overlay, unless the cache is itself on overlayfs (inside a container), where only vfs works."""
    path, mount, fstype = str(_storage_dir().resolve()), "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(mount):
            mount, fstype = point, fields[2]
    return "vfs" if fstype == "overlay" else "overlay"


def _buildah_argv(*args: str) -> list[str]:
    storage = _storage_dir()
    return [
        "buildah",
        "--root", str(storage / "root"),
        "--runroot", str(storage / "runroot"),
        "--storage-driver", _storage_driver(),
        *args,
    ]  # fmt: skip


def _run(argv: list[str], what: str) -> None:
    """Like fetch's: output to the build log, shown only on failure (buildah's argv is too long to log)."""
    log_file = cache_dir() / "build.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log.debug("running %s", shlex.join(argv))
    with open(log_file, "ab") as out:
        result = subprocess.run(argv, stdout=out, stderr=out)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed; last lines of {log_file}:\n{log_tail(log_file)}")


def _in_storage(ref: str) -> bool:
    argv = _buildah_argv("inspect", "--type", "image", ref)
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def _load(ref: str) -> None:
    """Make sure a parent image is in buildah's storage (after the storage was wiped, from its archive)."""
    if not _in_storage(ref):
        log.info("loading %s from its archive", ref)
        _run(_buildah_argv("pull", "--quiet", f"docker-archive:{archive_path(ref)}"), f"loading {ref}")


def _bud(
    ref: str,
    context: Path,
    containerfile: Path,
    *,
    target: str | None = None,
    build_args: Mapping[str, str] | None = None,
    volumes: Iterable[str] = (),
) -> None:
    argv = _buildah_argv(
        "bud", "--layers", "--force-rm", "--network=host", "--pull=never", "--isolation=oci", "--format=docker",
        "-f", str(containerfile), "-t", ref,
    )  # fmt: skip
    if target:
        argv += ["--target", target]
    for key, value in (build_args or {}).items():
        argv += ["--build-arg", f"{key}={value}"]
    for volume in volumes:
        argv += ["-v", volume]
    _run([*argv, str(context)], f"buildah bud of {ref}")


def _build_args_for_this_machine() -> tuple[dict[str, str], list[str]]:
    """Build arguments and read-only mounts giving pip and Maven this machine's CAs, and Maven the cache's
    local repository (the jars `fetch` already resolved). Not part of any image, so not part of a tag."""
    args: dict[str, str] = {}
    volumes: list[str] = []
    if CA_BUNDLE.is_file():
        volumes.append(f"{CA_BUNDLE}:/run/build-ca.crt:ro")
        args["PIP_CERT"] = "/run/build-ca.crt"
    m2 = cache_dir() / "m2"
    m2.mkdir(parents=True, exist_ok=True)
    volumes.append(f"{m2}:/run/m2")
    maven_opts = ["-Dmaven.repo.local=/run/m2"]
    if JAVA_TRUSTSTORE.is_file():
        volumes.append(f"{JAVA_TRUSTSTORE}:/run/build-cacerts:ro")
        maven_opts.append("-Djavax.net.ssl.trustStore=/run/build-cacerts")
    args["MAVEN_OPTS"] = " ".join(maven_opts)
    return args, volumes


def _ensure(name: str, tag: str, cold: str, build: Callable[[str, Path], None], *, archive: bool = True) -> str:
    """The image name:tag, built unless its archive (or, for a build-only image, the image) already exists.

    build(ref, scratch) builds into buildah's storage, with a scratch directory for its context.
    Afterwards older tags of the same image are removed from the storage and the cache.
    """
    ref = _ref(name, tag)
    if archive_path(ref).exists() if archive else _in_storage(ref):
        return ref
    log.info("building %s (cold: %s)", name, cold)
    started = time.monotonic()
    images_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-", dir=images_dir()) as scratch:
        build(ref, Path(scratch))
        if archive:
            tmp = Path(scratch) / "image.tar"
            _run(_buildah_argv("push", "--quiet", ref, f"docker-archive:{tmp}:{ref}"), f"saving {ref}")
            tmp.rename(archive_path(ref))
    _forget_other_tags(name, keep=tag)
    sizes = {"mb": archive_path(ref).stat().st_size // 2**20} if archive else {}
    log.info("built %s", ref, extra={"seconds": round(time.monotonic() - started, 1), **sizes})
    return ref


def _forget_other_tags(name: str, keep: str) -> None:
    """Older builds of an image: their archives and tags go (shared layers stay for the layer cache)."""
    for old in images_dir().glob(f"{name}-*.tar"):  # also matches fibers-job-….tar for fibers, hence the regex
        ours = re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{{TAG_LENGTH}}}\.tar", old.name)
        if ours and old.name != f"{name}-{keep}.tar":
            old.unlink()
    listed = subprocess.run(_buildah_argv("images", "--format", "{{.Name}}:{{.Tag}}"), capture_output=True, text=True)
    for ref in listed.stdout.split():
        if ref.startswith(f"localhost/{name}:") and ref != _ref(name, keep):
            subprocess.run(_buildah_argv("rmi", ref), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---- the images ------------------------------------------------------------------------------------


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _slim(rootfs: Path) -> None:
    """Turn a debootstrap tree into an image's root: no host files, caches, docs or device nodes."""
    for name in ("etc/hostname", "etc/resolv.conf", "var/log/bootstrap.log"):
        (rootfs / name).unlink(missing_ok=True)
    for pattern in ("dev/*", "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in rootfs.glob(pattern):
            if path.name != "partial":
                _remove(path)
    for folder in ("usr/share/man", "usr/share/locale", "usr/share/info", "usr/share/groff"):
        for path in (rootfs / folder).glob("*"):
            _remove(path)
    for path in (rootfs / "usr/share/doc").glob("*/*"):
        if path.name != "copyright":
            _remove(path)
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(DPKG_EXCLUDES)
    (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)


def _base() -> str:
    """Debian bookworm minbase from debootstrap, as an image; apt's sources stay as debootstrap wrote them."""
    debootstrap = ["debootstrap", "--variant=minbase", DEBIAN_SUITE]
    recipe = {
        "debootstrap": shlex.join([*debootstrap, DEBIAN_MIRROR]),
        "containerfile": BASE_CONTAINERFILE,
        "dpkg": DPKG_EXCLUDES,
        "apt": APT_CLEAN,
    }
    tag = inputs_hash([], recipe, REPO_ROOT)

    def build(ref: str, scratch: Path) -> None:
        rootfs = scratch / "rootfs"
        _run([*debootstrap, str(rootfs), DEBIAN_MIRROR], "debootstrap")
        _slim(rootfs)
        context = scratch / "context"
        context.mkdir()
        tar = ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(context / "rootfs.tar"), "."]
        _run(tar, "tar of the rootfs")
        shutil.rmtree(rootfs)
        (context / "Containerfile").write_text(BASE_CONTAINERFILE)
        _bud(ref, context, context / "Containerfile")

    return _ensure("base", tag, "~30 s", build)


def _maven_ref(base: str) -> str:
    return _ref("maven", inputs_hash([], {"containerfile": MAVEN_CONTAINERFILE.format(base=base)}, REPO_ROOT))


def _maven(base: str) -> None:
    """A Maven for the Dockerfile's jar stage (MAVEN_IMAGE): Debian's, on our base. Kept in buildah's storage only."""

    def build(ref: str, scratch: Path) -> None:
        _load(base)
        (scratch / "Containerfile").write_text(MAVEN_CONTAINERFILE.format(base=base))
        _bud(ref, scratch, scratch / "Containerfile")

    _ensure("maven", _split(_maven_ref(base))[1], "~15 s", build, archive=False)


def _from_dockerfile(
    name: str,
    target: str,
    cold: str,
    build_args: dict[str, str],
    prepare: Callable[[], None],
    root: Path = REPO_ROOT,
) -> str:
    """One target of the Dockerfile at `root` (the repository, or an earlier version's source tree);
    prepare() puts the images its FROMs name into buildah's storage."""
    dockerfile = root / "Dockerfile"
    tag = dockerfile_tag(dockerfile, root, {"target": target, **build_args})

    def build(ref: str, scratch: Path) -> None:
        prepare()
        local_args, volumes = _build_args_for_this_machine()
        _bud(ref, root, dockerfile, target=target, build_args={**build_args, **local_args}, volumes=volumes)

    return _ensure(name, tag, cold, build)


def _from_binary(name: str, binary: Path, containerfile: str, cold: str) -> str:
    """A FROM scratch image around one static binary (pause, coredns)."""
    tag = inputs_hash([binary], {"containerfile": containerfile}, binary.parent)

    def build(ref: str, scratch: Path) -> None:
        shutil.copy2(binary, scratch / binary.name)
        (scratch / "Containerfile").write_text(containerfile)
        _bud(ref, scratch, scratch / "Containerfile")

    return _ensure(name, tag, cold, build)


def _spark_operator(job: str, binary: Path) -> str:
    containerfile = tools_dir() / "spark-operator" / "Containerfile"
    tag = inputs_hash([containerfile, binary], {"JOB_IMAGE": job}, tools_dir())

    def build(ref: str, scratch: Path) -> None:
        _load(job)
        shutil.copy2(binary, scratch / "spark-operator")
        _bud(ref, scratch, containerfile, build_args={"JOB_IMAGE": job})

    return _ensure("spark-operator", tag, "~10 s", build)


def build_fibers(root: Path = REPO_ROOT, suffix: str = "") -> tuple[str, str]:
    """The operator's own two images, the Dockerfile's `operator` and `job` targets (what `make images` pushes).

    `root` and `suffix` build an earlier version from its source tree under names of its own
    (fibers<suffix>, fibers-job<suffix>), so that neither build drops the other's (see `_ensure`).
    """
    base = _base()
    operator = _from_dockerfile(
        f"fibers{suffix}", "operator", "~1 min", {"BASE_IMAGE": base}, lambda: _load(base), root=root
    )

    def job_parents() -> None:
        _load(base)
        _maven(base)

    job_args = {"BASE_IMAGE": base, "MAVEN_IMAGE": _maven_ref(base)}
    job = _from_dockerfile(f"fibers-job{suffix}", "job", "~1.5 min", job_args, job_parents, root=root)
    return operator, job


def build_all() -> Images:
    """Every image, each built only when its archive for the current inputs is missing.

    Needs the pause, CoreDNS and Spark Operator binaries (built here through `fetch` when missing).
    Measured on 2 cores: about 3 minutes cold (the binaries already built), about 45 s after an edit
    under operator/ (three 0.3-1 GB archives rewritten), under a second when nothing changed.
    """
    started = time.monotonic()
    pause_bin, coredns_bin, operator_bin = fetch.pause(), fetch.coredns(), fetch.spark_operator()
    operator, job = build_fibers()
    images = Images(
        base=_base(),
        operator=operator,
        job=job,
        spark_operator=_spark_operator(job, operator_bin),
        pause=_from_binary("pause", pause_bin, PAUSE_CONTAINERFILE, "seconds"),
        coredns=_from_binary("coredns", coredns_bin, COREDNS_CONTAINERFILE, "seconds"),
    )
    log.info("images ready", extra={"seconds": round(time.monotonic() - started, 1)})
    return images


def kueue() -> str:
    """Kueue's manager image (for the queue-admission test; built on demand, not by `build_all`)."""
    return _from_binary("kueue", fetch.kueue(), KUEUE_CONTAINERFILE, "seconds")


def on_job_image(name: str, context: Path, job: str) -> str:
    """A user's image from their own Dockerfile in `context`, `FROM` the job image (passed as the build
    argument FIBERS_JOB_IMAGE), built the way a user builds theirs (examples/callback)."""
    dockerfile = context / "Dockerfile"
    tag = dockerfile_tag(dockerfile, context, {"FIBERS_JOB_IMAGE": job})

    def build(ref: str, scratch: Path) -> None:
        _load(job)
        local_args, volumes = _build_args_for_this_machine()
        _bud(ref, context, dockerfile, build_args={"FIBERS_JOB_IMAGE": job, **local_args}, volumes=volumes)

    return _ensure(name, tag, "~30 s", build)


def publish(registry: Registry, built: Images) -> dict[str, str]:
    """Push every image the node runs to the stack's registry; by role, each one's reference by digest."""
    return {role: push(registry, ref) for role, ref in built.refs().items()}


def push(registry: Registry, ref: str) -> str:
    """Push one built image to the stack's registry; its reference by digest (<host>/<name>:<tag>@<digest>)."""
    return push_to(registry.host, ref, cert_dir=registry.cert_dir)


def push_to(destination: str, ref: str, *, cert_dir: Path | None = None) -> str:
    """Push one built image to any registry (a host, or a host and a path), loading it from its archive first
    if buildah's storage lost it; its reference by digest, the build's tag kept beside it."""
    _load(ref)
    name, tag = _split(ref)
    return push_image(destination, ref, name, tag, buildah=_buildah_argv(), cert_dir=cert_dir)


def chart_values(ref: str) -> dict[str, str]:
    """A reference as the chart's image values (`image`, `jobs.image`): registry, repository, tag, digest."""
    registry, repository, tag, digest = parse(ref)
    return {"registry": registry, "repository": repository, "tag": tag, "digest": digest}


def parse(ref: str) -> tuple[str, str, str, str]:
    """registry/name:tag@digest → (registry, name, tag, digest): the parts a chart's image values take. The
    registry may carry a path (registry.example.com/platform); the name is the last path segment."""
    named, _, digest = ref.partition("@")
    location, colon, tag = named.rpartition(":")
    if not colon or "/" in tag:  # no tag: that colon was the registry's port
        location, tag = named, ""
    registry, _, name = location.rpartition("/")
    return registry, name, tag, digest
