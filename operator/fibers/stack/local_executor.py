"""STAND-IN for the Spark Operator's controller and the kubelet — local stack only.

No container runtime exists on these machines, so nothing would ever run a SparkApplication's
driver. This process plays that part for Fibers' own workloads, in tests and the demo:
it watches SparkApplications, runs each one's job (`python -m fibers.jobs.transform`, the same
code the driver pod runs) with local Spark, and writes the status the way the Spark Operator does:
SUBMITTED → RUNNING → COMPLETED or FAILED, with driverInfo, attempts and times. Like the Spark
Operator's informers, it reacts to events: a watch on SparkApplications and the exit of a job wake
it at once (a half-second pass also runs, for pods and missed events). Deleting the
SparkApplication stops its job. Namespaces labelled `fibers.dev/local-executor=skip` are ignored,
which is how tests reproduce a Spark Operator that never picks a submission up.

It also stands in for the kubelet, for DatabusConsumer pods only (label fibers.dev/databusconsumer):
it runs the pod's container command as a local process, marks the pod Running and Ready,
restarts the process with a growing delay when it exits (restartPolicy Always), recording the
exit code and last error in the container status, and stops it when the pod is deleted.

It is not a general Spark Operator or kubelet: one attempt per application, no executors, no
images, no resource limits, and only Fibers' own workloads.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from fibers import logs
from fibers.conditions import format_time, utcnow

log = logging.getLogger("fibers.stack.local_executor")

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
SKIP_LABEL = "fibers.dev/local-executor"
CRD = Path(__file__).with_name("manifests") / "sparkapplications-standin-crd.yaml"


@dataclass
class Job:
    namespace: str
    name: str
    uid: str
    process: subprocess.Popen[bytes]
    log_file: Path


class LocalExecutor:
    def __init__(self, api: client.ApiClient, log_dir: Path) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ext = client.ApiextensionsV1Api(api)
        self.log_dir = log_dir
        self.jobs: dict[str, Job] = {}  # by uid
        self.pods = PodRunner(self.core, log_dir, self.resolve_env)
        self.wake = threading.Event()  # set by the watch and by exiting jobs: sync now

    def install_crd(self) -> None:
        body = yaml.safe_load(CRD.read_text())
        try:
            self.ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _skipped_namespaces(self) -> set[str]:
        items = self.core.list_namespace(label_selector=f"{SKIP_LABEL}=skip").items
        return {str(ns.metadata.name) for ns in items if ns.metadata}

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _env(self, namespace: str, app: dict[str, Any]) -> dict[str, str]:
        """The driver's environment."""
        return self.resolve_env(namespace, (app["spec"].get("driver") or {}).get("env") or [])

    def resolve_env(self, namespace: str, variables: list[Any]) -> dict[str, str]:
        """A container's environment with secretKeyRefs resolved, as the kubelet would."""
        env = dict(os.environ)
        for var in variables:
            var = var if isinstance(var, dict) else self.core.api_client.sanitize_for_serialization(var)
            if "value" in var:
                env[var["name"]] = str(var["value"])
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                secret = self.core.read_namespaced_secret(ref["name"], namespace)
                env[var["name"]] = base64.b64decode((secret.data or {})[ref["key"]]).decode()
        return env

    def start(self, app: dict[str, Any]) -> None:
        meta = app["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        now = format_time(utcnow())
        self._patch_status(
            namespace,
            name,
            {
                "applicationState": {"state": "SUBMITTED"},
                "submissionID": str(uuid.uuid4()),
                "submissionAttempts": 1,
                "lastSubmissionAttemptTime": now,
            },
        )
        log_file = self.log_dir / f"spark-{namespace}-{name}.log"
        argv = [sys.executable, "-m", "fibers.jobs.transform", *(app["spec"].get("arguments") or [])]
        with open(log_file, "ab") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self._env(namespace, app), start_new_session=True
            )
        self.jobs[uid] = Job(namespace, name, uid, process, log_file)
        threading.Thread(target=self._wake_on_exit, args=(process,), daemon=True).start()
        self._patch_status(
            namespace,
            name,
            {
                "applicationState": {"state": "RUNNING"},
                "driverInfo": {"podName": f"{name}-driver"},
                "executionAttempts": 1,
                "sparkApplicationId": f"local-{uid[:8]}",
            },
        )
        log.info("job started", extra={"namespace": namespace, "app": name, "pid": process.pid})

    def finish(self, job: Job, code: int) -> None:
        status: dict[str, Any] = {"terminationTime": format_time(utcnow())}
        if code == 0:
            status["applicationState"] = {"state": "COMPLETED"}
        else:
            status["applicationState"] = {"state": "FAILED", "errorMessage": _error_message(job.log_file, code)}
        self._patch_status(job.namespace, job.name, status)
        log.info("job finished", extra={"namespace": job.namespace, "app": job.name, "exit_code": code})

    def stop(self, job: Job) -> None:
        """The SparkApplication is gone: stop its job the way a deleted driver pod stops."""
        _stop_process(job.process)
        log.info("job stopped (application deleted)", extra={"namespace": job.namespace, "app": job.name})

    def sync(self) -> None:
        skipped = self._skipped_namespaces()
        self.pods.sync(skipped)
        listing = cast(dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))
        apps: list[dict[str, Any]] = listing["items"]
        present = set()
        for app in apps:
            meta = app["metadata"]
            present.add(meta["uid"])
            if meta["namespace"] in skipped or meta.get("deletionTimestamp"):
                continue
            state = ((app.get("status") or {}).get("applicationState") or {}).get("state")
            if not state and meta["uid"] not in self.jobs:
                try:
                    self.start(app)
                except Exception:
                    log.exception("could not start job", extra={"namespace": meta["namespace"], "app": meta["name"]})
        for uid, job in list(self.jobs.items()):
            if uid not in present:
                self.stop(job)
                del self.jobs[uid]
            elif (code := job.process.poll()) is not None:
                self.finish(job, code)
                del self.jobs[uid]

    def _wake_on_exit(self, process: subprocess.Popen[bytes]) -> None:
        process.wait()
        self.wake.set()

    def _watch_applications(self) -> None:
        """Wake the loop on every SparkApplication event; reconnect when the watch ends or fails."""
        while True:
            try:
                for _ in watch.Watch().stream(
                    self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=300
                ):
                    self.wake.set()
            except Exception as exc:  # the API server restarting, say; the half-second pass covers the gap
                log.warning("SparkApplication watch failed; reconnecting", extra={"error": str(exc)[:300]})
                time.sleep(1)

    def run(self, interval: float = 0.5) -> None:
        self.install_crd()
        threading.Thread(target=self._watch_applications, daemon=True).start()
        stopping = False

        def on_signal(*_: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("local executor running (stand-in for the Spark Operator)")
        while not stopping:
            try:
                self.sync()
            except Exception:
                log.exception("sync failed; retrying")
            self.wake.wait(interval)
            self.wake.clear()
        for job in self.jobs.values():
            self.stop(job)
        self.pods.stop_all()


@dataclass
class PodProcess:
    namespace: str
    name: str
    argv: list[str]
    env: dict[str, str]
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    restart_at: float = 0.0
    started_at: str = ""


class PodRunner:
    """Runs DatabusConsumer pods' containers as local processes (kubelet stand-in)."""

    LABEL = "fibers.dev/databusconsumer"

    def __init__(self, core: client.CoreV1Api, log_dir: Path, env_for: Any) -> None:
        self.core, self.log_dir, self.env_for = core, log_dir, env_for
        self.pods: dict[str, PodProcess] = {}  # by uid

    def _patch(self, pod: PodProcess, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _launch(self, pod: PodProcess) -> None:
        with open(pod.log_file, "ab") as out:
            pod.process = subprocess.Popen(
                pod.argv, stdout=out, stderr=subprocess.STDOUT, env=pod.env, start_new_session=True
            )
        pod.started_at = format_time(utcnow())
        ready = [{"type": t, "status": "True"} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
        self._patch(
            pod,
            {
                "phase": "Running",
                "conditions": ready,
                "startTime": pod.started_at,
                "containerStatuses": [self._container(pod, ready=True)],
            },
        )
        log.info("pod process started", extra={"namespace": pod.namespace, "pod": pod.name, "pid": pod.process.pid})

    def _container(self, pod: PodProcess, *, ready: bool, last: dict[str, Any] | None = None) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": "consumer",
            "ready": ready,
            "started": ready,
            "restartCount": pod.restarts,
            "image": "local",
            "imageID": "",
            "containerID": f"local://{pod.process.pid if pod.process else 0}",
            "state": {"running": {"startedAt": pod.started_at}}
            if ready
            else {"waiting": {"reason": "CrashLoopBackOff"}},
        }
        if last:
            status["lastState"] = {"terminated": last}
        return status

    def sync(self, skipped: set[str]) -> None:
        pods = self.core.list_pod_for_all_namespaces(label_selector=self.LABEL).items
        present = set()
        for pod in pods:
            meta = pod.metadata
            if meta is None or pod.spec is None or meta.namespace in skipped or meta.deletion_timestamp:
                continue
            present.add(meta.uid)
            if meta.uid not in self.pods:
                container = pod.spec.containers[0]
                command = list(container.command or []) + list(container.args or [])
                if command and command[0] == "fibers":  # the image's entry point is this project's CLI
                    command = [sys.executable, "-m", "fibers", *command[1:]]
                entry = PodProcess(
                    str(meta.namespace),
                    str(meta.name),
                    command,
                    self.env_for(str(meta.namespace), container.env or []),
                    self.log_dir / f"pod-{meta.namespace}-{meta.name}.log",
                )
                self.pods[str(meta.uid)] = entry
                self._launch(entry)
        now = time.monotonic()
        for uid, entry in list(self.pods.items()):
            if uid not in present:
                _stop_process(entry.process)
                del self.pods[uid]
                log.info("pod process stopped (pod deleted)", extra={"namespace": entry.namespace, "pod": entry.name})
                continue
            if entry.process is not None and (code := entry.process.poll()) is not None:
                entry.process = None
                entry.restarts += 1
                entry.restart_at = now + min(2**entry.restarts, 10)
                last = {
                    "exitCode": code,
                    "reason": "Error" if code else "Completed",
                    "message": _consumer_error(entry.log_file),
                    "finishedAt": format_time(utcnow()),
                }
                self._patch(
                    entry,
                    {
                        "conditions": [
                            {"type": "Ready", "status": "False"},
                            {"type": "ContainersReady", "status": "False"},
                        ],
                        "containerStatuses": [self._container(entry, ready=False, last=last)],
                    },
                )
                log.info(
                    "pod process exited", extra={"namespace": entry.namespace, "pod": entry.name, "exit_code": code}
                )
            elif entry.process is None and now >= entry.restart_at:
                self._launch(entry)

    def stop_all(self) -> None:
        for entry in self.pods.values():
            _stop_process(entry.process)


def _stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def _consumer_error(log_file: Path) -> str:
    """The consumer's own reason for stopping (its last error log line)."""
    import json

    for line in reversed(log_file.read_text(errors="replace").splitlines()[-50:]):
        if '"level": "error"' in line:
            try:
                return str(json.loads(line)["message"]).removeprefix("consumer stopped: ")[:1024]
            except ValueError:
                return line[:1024]
    return ""


def _error_message(log_file: Path, code: int) -> str:
    """Spark's own error, as the job printed it; otherwise the last lines of its output."""
    lines = log_file.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        if line.startswith("fibers-transform: error:"):
            return line.removeprefix("fibers-transform: error:").strip()[:2048]
    return f"driver exited with code {code}: " + " | ".join(lines[-5:])[:2000]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--log-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logs.setup()
    api = config.new_client_from_config(config_file=args.kubeconfig)
    LocalExecutor(api, args.log_dir).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
