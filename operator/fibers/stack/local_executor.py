"""STAND-IN for the Spark Operator's controller (and, later, the kubelet) — local stack only.

No container runtime exists on these machines, so nothing would ever run a SparkApplication's
driver. This process plays that part for Fibers' own workloads, in tests and the demo:
it watches SparkApplications, runs each one's job (`python -m fibers.jobs.transform`, the same
code the driver pod runs) with local Spark, and writes the status the way the Spark Operator does:
SUBMITTED → RUNNING → COMPLETED or FAILED, with driverInfo, attempts and times. Deleting the
SparkApplication stops its job. Namespaces labelled `fibers.dev/local-executor=skip` are ignored,
which is how tests reproduce a Spark Operator that never picks a submission up.

It is not a general Spark Operator: one attempt, no executors, no pods.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config
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
        """The driver's environment: secretKeyRefs resolved, as the kubelet would."""
        env = dict(os.environ)
        for var in (app["spec"].get("driver") or {}).get("env") or []:
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
        try:
            os.killpg(job.process.pid, signal.SIGTERM)
            job.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.process.pid, signal.SIGKILL)
            job.process.wait()
        except ProcessLookupError:
            pass
        log.info("job stopped (application deleted)", extra={"namespace": job.namespace, "app": job.name})

    def sync(self) -> None:
        skipped = self._skipped_namespaces()
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

    def run(self, interval: float = 0.5) -> None:
        self.install_crd()
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
            time.sleep(interval)
        for job in self.jobs.values():
            self.stop(job)


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
