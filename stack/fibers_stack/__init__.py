"""The local stack: a real one-node Kubernetes cluster, Kafka + Connect, PostgreSQL, FerretDB, Apicurio Registry
and Prometheus.

Test and demo infrastructure only (never shipped with the operator). `up()` starts what is missing and
records endpoints and pids in <run dir>/stack.json; `down()` stops every process it started and removes
what the node added to the host (mounts, links, iptables chains, cgroups).

The cluster is real: containerd runs the pods, the kubelet reports a Ready node, kube-proxy and
CoreDNS serve Services, and the Kubeflow Spark Operator runs SparkApplications, all from images
built here from this repository's Dockerfile (see `images`). Servers bind to the node IP, which the
pods reach (see `network`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fibers_stack import (
    apicurio,
    coredns,
    ferretdb,
    fetch,
    images,
    kafka,
    kube,
    network,
    node,
    postgres,
    process,
    prometheus,
    registry,
    services,
    spark_operator,
)
from fibers_stack.launcher import Launcher
from fibers_stack.layout import run_dir

log = logging.getLogger("fibers_stack")

STOP_SIGNALS = {"postgres": signal.SIGINT}  # SIGINT is PostgreSQL's fast shutdown
# Stopped in this order: clients before servers, and the node's workloads drained (see `_drain`)
# while the kubelet still runs; the API server last but etcd.
STOP_ORDER = (
    "prometheus-discovery",
    "prometheus",
    "kafka-connect",
    *sorted(kafka.extra_workers(kafka.MAX_CONNECT_WORKERS)),
    "apicurio",
    "kafka",
    "ferretdb",
    "postgres",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "containerd",
    "registry",
    "kube-apiserver",
    "etcd",
)


@dataclass
class StackInfo:
    run_dir: str
    kubeconfig: str = ""
    apiserver: str = ""
    kafka_bootstrap: str = ""
    connect_url: str = ""
    connect_tls_url: str = ""  # the same worker's REST API over TLS, with a CA of its own
    connect_tls_ca: str = ""  # that CA (PEM file)
    postgres_dsn: str = ""
    postgres_role_checked: str = ""  # a role whose members PostgreSQL asks for their password (postgres.py)
    mongodb_uri: str = ""
    registry_url: str = ""  # Apicurio Registry's base URL; its Confluent-compatible API is under /apis/ccompat/v7
    spark_kafka_jars: str = ""
    prometheus_url: str = ""  # scrapes what the monitors in the cluster select (`prometheus.sync`)
    kube_pki: str = ""
    audit_log: str = ""  # the API server's audit log (JSON lines; `audit.requests` reads it)
    node_ip: str = network.NODE_IP
    image_registry: str = ""  # host:port of the stack's OCI registry (`registry`), over TLS
    image_registry_ca: str = ""  # the CA its certificate is signed by (PEM file)
    chart: str = ""  # the operator's chart in that registry: oci://<registry>/charts/fibers
    chart_version: str = ""
    images: dict[str, str] = field(default_factory=dict)  # by role, in the registry, by digest (pods use these)
    # host:port by server, as manifests name them: cluster names (`services`) that reach the servers above
    cluster_addresses: dict[str, str] = field(default_factory=dict)
    built: dict[str, str] = field(default_factory=dict)  # by role, as built (localhost/<name>:<tag>, buildah's)
    pids: dict[str, int] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return Path(self.run_dir) / "logs"

    def env(self) -> dict[str, str]:
        """Environment variables that point clients (kubectl, jobs, the operator) at this stack."""
        env = {
            "KUBECONFIG": self.kubeconfig,
            "FIBERS_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "FIBERS_POSTGRES_DSN": self.postgres_dsn,
            "FIBERS_MONGODB_URI": self.mongodb_uri,
            "FIBERS_SPARK_KAFKA_JARS": self.spark_kafka_jars,
            "FIBERS_JOB_IMAGE": self.images.get("job", ""),
            "FIBERS_JOB_IMAGE_PULL_POLICY": "IfNotPresent",
            "FIBERS_ALLOW_HOST_PATH": "true",  # the one-node stack's pipelines read and write files on the node
        }
        if self.registry_url:
            env["FIBERS_SCHEMA_REGISTRY_URL"] = self.registry_url + apicurio.CCOMPAT
        return env

    def chart_values(self, namespaces: list[str]) -> dict[str, Any]:
        """Values for charts/fibers on this stack: its images (from its registry, by digest), its endpoints,
        and the namespaces to watch. Callers add what they turn on."""

        def image(ref: str) -> dict[str, str]:
            return {**images.chart_values(ref), "pullPolicy": "IfNotPresent"}

        return {
            "image": image(self.images["operator"]),
            "watch": {"namespaces": namespaces},
            "connect": {"url": self.connect_url},
            "schemaRegistry": {"url": self.registry_url + apicurio.CCOMPAT},
            "kafka": {"bootstrap": self.kafka_bootstrap},
            "jobs": {"image": image(self.images["job"])},
            "policy": {"allowHostPath": True},  # the one-node stack's pipelines read and write files on the node
        }

    def oci_registry(self) -> registry.Registry:
        """The stack's OCI registry (where its images and chart are), as `registry` pushes to it."""
        return registry.Registry(host=self.image_registry, ca=Path(self.image_registry_ca))

    def chart_source(self) -> list[str]:
        """The chart argument of `helm install`/`upgrade` on this stack: from its registry, as a user installs it."""
        return registry.chart_source(self.chart, self.chart_version, Path(self.image_registry_ca))

    def dead(self) -> list[str]:
        return [name for name, pid in self.pids.items() if not process.alive(pid)]


def user_image(info: StackInfo, name: str, context: Path) -> str:
    """Build a user's image from the Dockerfile in `context` (FROM the stack's job image) and push it to the
    stack's registry, as a user pushes theirs to a registry the cluster pulls from; its reference by digest."""
    ref = images.on_job_image(name, context, info.built["job"])
    return images.push(info.oci_registry(), ref)


def _state_file() -> Path:
    return run_dir() / "stack.json"


def current() -> StackInfo | None:
    """The recorded stack, if any (running or not)."""
    try:
        recorded = json.loads(_state_file().read_text())
    except FileNotFoundError:
        return None
    # A stack recorded by another version of this package (a newer clone, or an older one) may name fields
    # this one does not know; it is still stopped cleanly by its pids, and `_complete` decides on a restart.
    known = {f.name for f in fields(StackInfo)}
    return StackInfo(**{key: value for key, value in recorded.items() if key in known})


def up() -> StackInfo:
    """Start the whole stack, or return the running one."""
    running = current()
    if running and running.pids and not running.dead() and _complete(running):
        log.info("stack already running", extra={"run_dir": running.run_dir})
        return _with_current_images(running)
    if running:
        # Stopped, half dead, or started by an earlier version without a component this one has.
        down()
    elif orphans := _orphans(run_dir()):
        # A start or stop that was interrupted lost stack.json but left servers running: stop them first.
        log.warning("stopping a stack that was not recorded", extra={"processes": sorted(orphans.pids)})
        _stop_all(orphans)
    # Builds happen here, once, before any server starts; the images last (they need the binaries).
    # Argo CD is built when a test first starts it (fetch.ON_DEMAND), not here.
    fetch.fetch_all([name for name in fetch.COMPONENTS if name != "images" and name not in fetch.ON_DEMAND])
    built = images.build_all()

    root = run_dir()
    shutil.rmtree(root, ignore_errors=True)  # every start is a fresh cluster
    root.mkdir(parents=True)
    root.chmod(0o755)
    network.setup()
    launcher = Launcher(root)
    info = StackInfo(run_dir=str(root), spark_kafka_jars=str(fetch.spark_kafka_jars()), built=built.refs())
    started = time.monotonic()
    components: dict[str, Callable[[], dict[str, str]]] = {
        "kubernetes": lambda: _start_kubernetes(launcher, built, info),
        "kafka": lambda: kafka.start(launcher),
        "postgres": lambda: postgres.start(launcher),
        "ferretdb": lambda: ferretdb.start(launcher),
        "apicurio": lambda: apicurio.start(launcher),
        "prometheus": lambda: prometheus.start(launcher),
    }
    try:
        with ThreadPoolExecutor(len(components)) as pool:
            futures = {name: pool.submit(start) for name, start in components.items()}
            for name, future in futures.items():
                for key, value in future.result().items():
                    setattr(info, key, value)
                log.info("%s ready", name, extra={"seconds": round(time.monotonic() - started, 1)})
        prometheus.start_discovery(launcher, info.kubeconfig, info.prometheus_url)
        info.cluster_addresses = _install_services(info)
    except BaseException:
        info.pids = dict(launcher.pids)
        _save(info)
        down()
        raise
    info.pids = dict(launcher.pids)
    info.commands = dict(launcher.commands)
    _save(info)
    log.info("stack up", extra={"seconds": round(time.monotonic() - started, 1), "logs": str(info.log_dir)})
    return info


def _complete(running: StackInfo) -> bool:
    """A running stack has what this version starts (else it was started by an earlier one, or with fewer
    Connect workers than FIBERS_CONNECT_WORKERS asks for now)."""
    return _wanted() <= set(running.pids) and bool(running.cluster_addresses and running.postgres_role_checked)


def _wanted() -> set[str]:
    """The processes a stack started now runs: every one STOP_ORDER knows but the Connect workers not asked for."""
    optional, asked = kafka.extra_workers(kafka.MAX_CONNECT_WORKERS), kafka.extra_workers(kafka.connect_workers())
    return (set(STOP_ORDER) - optional) | asked


def _install_services(info: StackInfo) -> dict[str, str]:
    from kubernetes import config

    ports = {s.name: services.node_port(getattr(info, s.url_field)) for s in services.SERVERS}
    with config.new_client_from_config(config_file=info.kubeconfig) as api:
        return services.install(api, ports)


def _start_kubernetes(launcher: Launcher, built: images.Images, info: StackInfo) -> dict[str, str]:
    """Control plane and the runtime (the registry, then containerd) side by side, then the node, CoreDNS
    and the Spark Operator. Records the registry, the images and the chart in `info`."""
    from kubernetes import config

    with ThreadPoolExecutor(2) as pool:
        plane = pool.submit(kube.start, launcher)
        runtime = pool.submit(_start_runtime, launcher, built, info)
        endpoints = plane.result()
        runtime.result()
    node.start_kubelet(launcher, endpoints["apiserver"], Path(endpoints["kube_pki"]))
    node.start_kube_proxy(launcher, endpoints["kubeconfig"])
    api = config.new_client_from_config(config_file=endpoints["kubeconfig"])
    try:
        coredns.install(api, info.images["coredns"])
        prometheus.install_crds(api)
        spark_operator.install(api, endpoints["kubeconfig"], info.images["spark-operator"], run_dir=launcher.run_dir)
        process.wait_until(
            lambda: coredns.ready(api),
            name="coredns",
            pid=launcher.pids["kubelet"],
            log_file=launcher.log_file("kubelet"),
            timeout=120,
        )
    finally:
        api.close()
    return endpoints


def _with_current_images(running: StackInfo) -> StackInfo:
    """A running stack takes the images of the code as it is now.

    An edit under operator/ since the stack started is a new image tag. Without this, pods of a reused stack
    ran the old code, and an image built FROM the job image (`user_image`) failed: building the new tag had
    removed the old one's archive. The new images are pushed next to the old ones, which pods started
    earlier (the Spark Operator, an installed chart) may still use; the chart is pushed again too.
    """
    built = images.build_all()
    reg = running.oci_registry()
    chart, version = registry.push_chart(reg.host, reg.ca)
    if built.refs() == running.built and (chart, version) == (running.chart, running.chart_version):
        return running
    published = running.images if built.refs() == running.built else images.publish(reg, built)
    fields = {"built": built.refs(), "images": published, "chart": chart, "chart_version": version}
    updated = StackInfo(**{**asdict(running), **fields})
    _save(updated)
    log.info("the running stack took the current images", extra={"images": published})
    return updated


def _start_runtime(launcher: Launcher, built: images.Images, info: StackInfo) -> None:
    """The registry first, with the images and the chart pushed to it, then containerd, which pulls from it."""
    reg = registry.start(launcher)
    info.image_registry, info.image_registry_ca = reg.host, str(reg.ca)
    info.images = images.publish(reg, built)
    info.chart, info.chart_version = registry.push_chart(reg.host, reg.ca)
    registry.trust(reg, node.registry_hosts_dir(launcher.run_dir))
    node.start_containerd(launcher, info.images["pause"])


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


def _stop(info: StackInfo, name: str) -> None:
    if name in info.pids:
        process.stop(
            info.pids[name], STOP_SIGNALS.get(name, signal.SIGTERM), timeout=60 if name == "kube-apiserver" else 20
        )


def _running(info: StackInfo, name: str) -> bool:
    return name in info.pids and process.alive(info.pids[name])


def _drain(info: StackInfo) -> None:
    """Delete every pod while the kubelet runs, so it unmounts volumes and tears pod networks down.

    The controller manager and scheduler are already stopped, so nothing comes back.
    """
    from kubernetes import client, config

    if not info.kubeconfig or not _running(info, "kube-apiserver"):
        return
    try:
        api = config.new_client_from_config(config_file=info.kubeconfig)
        core = client.CoreV1Api(api)
        pods: list[Any] = core.list_pod_for_all_namespaces().items
        for pod in pods:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and node.ctr(Path(info.run_dir), "tasks", "list", "-q", check=False).stdout.strip()
        ):
            time.sleep(0.5)
        api.close()
    except Exception as exc:  # a half-started stack: the host clean-up below still runs
        log.warning("could not drain the node: %s", exc)


def _stop_all(info: StackInfo) -> None:
    extras = [name for name in info.pids if name not in STOP_ORDER]  # the demo's operator, …
    root = Path(info.run_dir)
    for name in (*extras, *STOP_ORDER):
        if name == "kubelet":
            _drain(info)
        if name == "containerd" and (root / "containerd").exists() and shutil.which("ctr"):
            # Containers the drain did not reach (a kubelet that had died) go before containerd does.
            if _running(info, name):
                node.remove_containers(root)
            else:
                _cleanup_runtime(info)
        _stop(info, name)
    node.unmount_all(root)
    bins = fetch.kubernetes_if_built()
    if bins is not None:
        subprocess.run([str(bins / "kube-proxy"), "--cleanup"], capture_output=True, check=False)
    network.teardown()
    node.remove_cgroups()
    node.clear_host_paths()


def _orphans(root: Path) -> StackInfo | None:
    """The servers of an unrecorded stack in `root`, found by their command lines (None when there are none)."""
    pids: dict[str, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(str(root) in arg for arg in argv):
            continue
        if any("ConnectDistributed" in arg for arg in argv):
            workers = [m.group(1) for arg in argv if (m := re.search(r"connect-distributed-(\d+)\.properties$", arg))]
            name = kafka.worker_name(int(workers[0]) if workers else 1)
        elif "kafka.Kafka" in argv:
            name = "kafka"
        elif any(Path(arg).name.startswith("apicurio-registry-app-") and arg.endswith("-runner.jar") for arg in argv):
            name = "apicurio"
        elif "fibers_stack.discovery" in argv:
            name = "prometheus-discovery"
        else:
            name = Path(argv[0]).name
            if name == "postgres" and "-D" not in argv:
                continue  # a backend: the postmaster stops it
        if name in STOP_ORDER and process.alive(int(proc.name)):
            pids.setdefault(name, int(proc.name))
    return StackInfo(run_dir=str(root), pids=pids) if pids else None


def _cleanup_runtime(info: StackInfo) -> None:
    """With containerd gone (it died, or a half-started stack): start it once more to remove the containers."""
    root = Path(info.run_dir)
    launcher = Launcher(root)
    launcher.spawn("containerd-cleanup", info.commands.get("containerd", {}).get("argv") or ["true"])
    try:
        process.wait_until(
            lambda: node.ctr(root, "version", check=False).returncode == 0,
            name="containerd",
            pid=launcher.pids["containerd-cleanup"],
            log_file=launcher.log_file("containerd-cleanup"),
            timeout=30,
        )
        node.remove_containers(root)
    except process.StackError as exc:
        log.warning("containerd clean-up: %s", exc)
    finally:
        process.stop(launcher.pids["containerd-cleanup"])


def down() -> None:
    """Stop every recorded process, remove what the node added to the host, and the run directory's data."""
    info = current() or _orphans(run_dir())
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


def leftovers() -> list[str]:
    """What a stack left on the host after `down` (tests assert it is empty)."""
    root = run_dir()
    found = [f"mount {m}" for m in node.leftover_mounts(root)] + network.leftovers()
    found += [f"cgroup {c}" for c in node.leftover_cgroups()]
    names = {"containerd", "kubelet", "kube-apiserver", "etcd", "kube-proxy", "coredns", "spark-operator"}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                comm = (proc / "comm").read_text().strip()
            except OSError:
                continue
            if (comm in names or comm.startswith("containerd-shim")) and process.alive(int(proc.name)):
                found.append(f"process {comm} ({proc.name})")
    return found


def status() -> int:
    """Print the stack's processes, the node and the pods; 0 when everything is up."""
    recorded = current()
    if recorded is None:
        print("no stack recorded")
        return 1
    dead = recorded.dead()
    print(json.dumps({**asdict(recorded), "dead": dead}, indent=2))
    if recorded.pids and "kube-apiserver" not in dead:
        kubectl = fetch.kubernetes() / "kubectl"
        for what in (["get", "nodes", "-o", "wide"], ["get", "pods", "-A", "-o", "wide"]):
            subprocess.run([str(kubectl), "--kubeconfig", recorded.kubeconfig, *what], check=False)
    return 1 if dead or not recorded.pids else 0
