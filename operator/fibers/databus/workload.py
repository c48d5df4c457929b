"""What runs a DatabusConsumer: its rendered configuration and the StatefulSet of its instances (pure).

One StatefulSet, `spec.instances` replicas: pod `<name>-i` is instance i. The pods learn the number of
instances from the StatefulSet while they run and hand partitions over through Leases
(`fibers.consumer.ownership`), so a rescale changes `replicas` only — the pod template, and so the
running pods, stay as they are.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fibers import termination
from fibers.api import DATABUS_PLURAL
from fibers.databus.config import POD_NAME_ENV, POD_UID_ENV, sink_name, sink_specs
from fibers.databus.owners import LABEL_CONSUMER
from fibers.kube import adopt
from fibers.startfrom import StartFrom
from fibers.upstream import Upstream
from fibers.watches import Child

PLURAL = DATABUS_PLURAL
KIND = "DatabusConsumer"
# Watched: a change to the StatefulSet (ready replicas), a pod (an instance exiting) or the checkpoint
# ConfigMap (the consumers' progress) brings the consumer back to its reconciler.
CHILDREN = (
    Child("apps/v1", "statefulsets", LABEL_CONSUMER),
    Child("v1", "pods", LABEL_CONSUMER),
    Child("v1", "configmaps", LABEL_CONSUMER),
)
# The consumer container's `/metrics` (port name `metrics`, what the chart's PodMonitor scrapes).
METRICS_PORT = 9404
# NotReady while the API server does not take the instance's checkpoints (`telemetry.unready`): one failed
# probe, since the instance only answers 503 after waiting API_WAIT_UNREADY_SECONDS already.
READINESS_PROBE: dict[str, Any] = {
    "httpGet": {"path": "/ready", "port": "metrics"},
    "periodSeconds": 5,
    "failureThreshold": 1,
}
SINK_URI_ENV, STORE_URI_ENV = "FIBERS_SINK_MONGODB_URI", "FIBERS_BOOTSTRAP_MONGODB_URI"


def sink_uri_env(index: int) -> str:
    """The environment variable carrying the URI of the index-th sink, from its `uriSecretRef` (the first
    sink's keeps the name it had when a consumer had one sink)."""
    return SINK_URI_ENV if index == 0 else f"FIBERS_SINK_{index}_URI"


def checkpoint_config_map(body: dict[str, Any]) -> str:
    return str((body["spec"].get("checkpoint") or {}).get("configMapName") or f"{body['metadata']['name']}-checkpoint")


def render_config(
    body: dict[str, Any],
    *,
    topics: list[str],
    kafka_bootstrap: str | None,
    producers: dict[str, dict[str, str]] | None = None,
    seek: StartFrom | None = None,
    reapply: bool = False,
    registry_url: str | None = None,
    lineage: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON `fibers consume` runs from, the same for every instance; secrets stay in environment variables.

    `topics`: spec.sources, then what spec.sourceRefs resolved to (`consumed_topics`), and `producers`
    the resource each of those came from (`producers`, for lineage); `registry_url`:
    the schema registry of spec.relay.avro, resolved by the reconciler; `lineage`: where
    the operator sends OpenLineage events ({topic, bootstrapServers, namespace}), None when it does not.
    """
    meta, spec = body["metadata"], body["spec"]
    bootstrap_servers = (spec.get("relay") or {}).get("bootstrapServers") or kafka_bootstrap
    if not bootstrap_servers:
        raise ValueError("spec.relay.bootstrapServers is not set and the operator has no default Kafka")
    sinks = []
    for index, (where, sink) in enumerate(sink_specs(spec)):
        if sink.pop("uriSecretRef", None):  # MongoDB sinks, or a callback's own connection (its `uri` argument)
            sink["uriEnv"] = sink_uri_env(index)
        if reapply and sink["type"] == "mongodb":  # a seek with sinks: reapply (fibers.consumer.store)
            sink["reapply"] = True
        sinks.append({**sink, "field": where, "name": sink_name(sink)})
    bootstrap = spec.get("bootstrap") or {}
    policy = spec.get("callbackPolicy") or {}
    checkpoint = spec.get("checkpoint") or {}
    relay: dict[str, Any] = {"bootstrapServers": bootstrap_servers, "topics": list(topics)}
    if registry_url:
        relay["avro"] = {"registryUrl": registry_url}
    if producers:
        relay["producers"] = {topic: producers[topic] for topic in topics if topic in producers}
    return {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "relay": relay,
        "sinks": sinks,
        "bootstrap": {"uriEnv": STORE_URI_ENV, "database": bootstrap["database"]} if bootstrap.get("enabled") else None,
        "checkpoint": {
            "configMapName": checkpoint_config_map(body),
            "minIntervalSeconds": float(checkpoint.get("minIntervalSeconds", 1)),
        },
        **_start_from(spec, seek),
        "callback": {
            "timeoutSeconds": policy.get("timeoutSeconds", 60),
            "retries": policy.get("retries", 5),
            "retryBackoffSeconds": policy.get("retryBackoffSeconds", 1),
        },
        "onUndecodable": dict(spec.get("onUndecodable") or {}),
        "labels": {LABEL_CONSUMER: meta["name"], "fibers.dev/consumer-uid": meta["uid"]},
        "lineage": {**lineage, "job": f"{meta['namespace']}.databusconsumer.{meta['name']}"} if lineage else None,
    }


def consumed_topics(
    spec: dict[str, Any], upstreams: list[Upstream], pinned: list[str] | None, namespace: str
) -> tuple[list[str], str, str]:
    """(topics, waiting, moved): the topics this consumer consumes, in order — spec.sources, then each
    sourceRef's topics — and why they cannot be known yet ("" when they can).

    Checkpoints belong to one list of sources (its hash is stored with them), so once a consumer
    has checkpointed, `pinned` (status.sources) is what it keeps consuming; `moved` then says that
    the upstream resolves to something else now. Nothing is reset behind the user's back.
    """
    topics = list(spec.get("sources") or [])
    waiting = ""
    for upstream in upstreams:
        found = upstream.change_topics()
        if not found:
            what = "has reported no topics yet" if upstream.ref.kind == "Connect" else "has no Kafka output"
            waiting = waiting or upstream.trouble(namespace) or f"{upstream.ref.label} ({upstream.ref.field}) {what}"
        topics += [topic for topic in found if topic not in topics]
    if pinned:
        moved = "" if waiting or topics == pinned else f"sourceRefs now resolve to {topics}; consuming {pinned}"
        return list(pinned), "", moved
    return topics, waiting, ""


def producers(upstreams: list[Upstream], namespace: str) -> dict[str, dict[str, str]]:
    """Each resolved topic's producer (the referenced Connect or Transform), for lineage events."""
    return {
        topic: {"kind": u.ref.kind, "name": u.ref.name, "namespace": namespace}
        for u in upstreams
        for topic in u.topics()
    }


def _secret_env(name: str, ref: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}}}


def statefulset(
    body: dict[str, Any],
    *,
    config: dict[str, Any],
    image: str,
    service_account: str | None,
    image_pull_policy: str = "IfNotPresent",
) -> dict[str, Any]:
    meta, spec = body["metadata"], body["spec"]
    name = meta["name"]
    rendered = json.dumps(config, sort_keys=True)
    labels = {LABEL_CONSUMER: name}
    env: list[dict[str, Any]] = [
        {"name": "FIBERS_CONSUMER_CONFIG", "value": rendered},
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    for index, (_, sink) in enumerate(sink_specs(spec)):
        if sink.get("uriSecretRef"):
            env.append(_secret_env(sink_uri_env(index), sink["uriSecretRef"]))
    if (spec.get("bootstrap") or {}).get("enabled"):
        env.append(_secret_env(STORE_URI_ENV, spec["bootstrap"]["uriSecretRef"]))
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "consumer",
                "image": spec.get("image") or image,
                "imagePullPolicy": image_pull_policy,
                "args": ["consume", "--metrics-port", str(METRICS_PORT)],  # after the entry point (tini, `fibers`)
                "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                "readinessProbe": READINESS_PROBE,
                "terminationMessagePolicy": termination.POLICY,
                "env": env,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    if spec.get("serviceAccount") or service_account:
        pod_spec["serviceAccountName"] = spec.get("serviceAccount") or service_account
    template_hash = hashlib.sha256((rendered + json.dumps(pod_spec, sort_keys=True)).encode()).hexdigest()[:12]
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels},
        "spec": {
            "replicas": 0 if spec.get("state") in ("stopped", "suspended") else int(spec.get("instances", 1)),
            # Pods start and stop together: a partition waits on its Lease, not on a pod's ordinal turn.
            "podManagementPolicy": "Parallel",
            # A changed template replaces one pod at a time; each ordinal's old pod is gone before its new one starts.
            "updateStrategy": {"type": "RollingUpdate"},
            "serviceName": "",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "fibers.dev/template-hash": template_hash,
                        "fibers.dev/restart-nonce": str(spec.get("restartNonce") or ""),
                    },
                },
                "spec": pod_spec,
            },
        },
    }
    adopt(manifest, body)
    return manifest


def _start_from(spec: dict[str, Any], seek: StartFrom | None) -> dict[str, Any]:
    """Where timelines without a checkpoint start: a seek under way, else spec.startFrom, else the older
    spec.startPosition, else the oldest record; with the field that said so, for messages."""
    if seek is not None:
        return {"startFrom": seek.to_dict(), "startFromField": "spec.seek.startFrom"}
    if "startFrom" in spec:
        return {"startFrom": dict(spec["startFrom"]), "startFromField": "spec.startFrom"}
    position = str(spec.get("startPosition", "earliest"))
    return {"startFrom": {"position": position}, "startFromField": "spec.startPosition"}


def seek_position(seek: dict[str, Any]) -> StartFrom:
    """Where a seek starts the consumer again: spec.seek.startFrom, or its older form `to` (a position)."""
    if "startFrom" in seek:
        return StartFrom.parse(seek["startFrom"], "spec.seek.startFrom")
    return StartFrom(position=str(seek["to"]))
