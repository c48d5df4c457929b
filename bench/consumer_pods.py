"""A `fibers consume` process in a pod of its own, for the fault matrix: the job image, the consumer
ServiceAccount and the security context consumer pods run with, on the real kubelet.

The harness plays the StatefulSet's part itself: a pod whose consumer died (`kill` failpoint, exit 137
through tini) is replaced by a new one without the fault, and the last one is stopped with SIGTERM
sent to its PID 1 (tini hands it on), so its exit code is read from the pod's status, as the kubelet
recorded it. Pods have `restartPolicy: Never`: the kubelet restarts nothing behind the harness's back,
so "a transient fault restarted no container" is a count of pods and exit codes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

from fibers.databus.workload import METRICS_PORT, READINESS_PROBE
from fibers_stack.namespaces import CONSUMER_SERVICE_ACCOUNT

KILLED = 137  # a container whose process was SIGKILLed, as tini reports it
HUNG = "hung on SIGTERM"  # an exit the harness had to force
STOP_SECONDS = 30.0  # what a pod's termination grace gives a consumer to stop
START_SECONDS = 120.0  # the most a pod may take to be scheduled and start on a busy one-node stack


class ConsumerPod:
    """One consumer process in a pod: started at once, polled for its exit, stopped, and its log read."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        name: str,
        *,
        image: str,
        config: dict[str, Any],
        env: dict[str, str],
    ) -> None:
        self.core, self.namespace, self.name = core, namespace, name
        self._log = ""  # the whole log once the container ended (it no longer changes)
        self._ended: int | None = None
        container = {
            "name": "consumer",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "args": ["consume", "--config", json.dumps(config), "--metrics-port", str(METRICS_PORT)],
            "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
            "readinessProbe": READINESS_PROBE,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"fibers.dev/fault-matrix": namespace}},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": CONSUMER_SERVICE_ACCOUNT,
                "terminationGracePeriodSeconds": int(STOP_SECONDS),
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
            },
        }
        core.create_namespaced_pod(namespace, pod)

    def _state(self) -> dict[str, Any]:
        pod = self.core.read_namespaced_pod(self.name, self.namespace)
        statuses = pod.status.container_statuses or []
        return statuses[0].state.to_dict() if statuses else {}

    def poll(self) -> int | None:
        """The consumer's exit code once its container ended; None while it starts or runs."""
        if self._ended is None:
            terminated = self._state().get("terminated")
            if terminated:
                self._ended = int(terminated["exit_code"])
        return self._ended

    def running(self) -> bool:
        return bool(self._state().get("running"))

    def ready(self) -> bool:
        """Its readiness probe passes (the consumer is not held up waiting for the API server)."""
        return self.readiness()[1]

    def readiness(self) -> tuple[bool, bool]:
        """(running, ready), from one read of the pod."""
        statuses = self.core.read_namespaced_pod(self.name, self.namespace).status.container_statuses or []
        if not statuses:
            return False, False
        return statuses[0].state.running is not None, bool(statuses[0].ready)

    def wait_running(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and not self.running() and self.poll() is None:
            time.sleep(0.3)

    def stop(self) -> int | str:
        """SIGTERM to PID 1, as the kubelet sends it; the exit code, or HUNG when the grace ran out."""
        if self.poll() is None:
            stream(
                self.core.connect_get_namespaced_pod_exec,
                self.name,
                self.namespace,
                command=["/bin/sh", "-c", "kill -TERM 1"],
                stderr=True,
                stdout=True,
                stdin=False,
                tty=False,
            )
            deadline = time.monotonic() + STOP_SECONDS
            while time.monotonic() < deadline and self.poll() is None:
                time.sleep(0.3)
        code = self.poll()
        return HUNG if code is None else code

    def log(self) -> str:
        if self._log:
            return self._log
        try:  # raw: the client would otherwise parse a one-line log that happens to be JSON
            reply = self.core.read_namespaced_pod_log(
                self.name, self.namespace, container="consumer", _preload_content=False
            )
        except client.exceptions.ApiException:  # not started yet
            return ""
        text = reply.data.decode(errors="replace")
        if self.poll() is not None:
            self._log = text
        return text

    def delete(self) -> None:
        try:
            self.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
