"""Reading a Transform and rendering what its job receives (pure: no I/O)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from croniter import croniter

from fibers import podpolicy
from fibers.api import TRANSFORM_PLURAL
from fibers.jobs.spec import JobSpec, SpecError, result_config_map
from fibers.podpolicy import PodPolicy

PLURAL = TRANSFORM_PLURAL
KIND = "Transform"


class InputsNotReady(Exception):
    """An input cannot be resolved yet (a referenced resource missing, or with no topics yet); retried later."""


@dataclass(frozen=True)
class Defaults:
    """Operator-wide defaults a Transform may leave out."""

    kafka_bootstrap: str | None = None
    image: str = "fibers-job:latest"
    image_pull_policy: str = "IfNotPresent"  # the local stack uses Never: its images are imported, not pulled
    service_account: str | None = None
    spark_version: str = "4.0.0"  # the pyspark of the job image
    core_request: str | None = "200m"  # CPU request of driver and executor pods (their `cores` is Spark's parallelism)
    memory: str = "512m"  # driver and executor heap; PySpark adds at least 384 MiB of overhead to the pod
    schema_registry: str | None = None  # the SchemaRegistry of Avro inputs and outputs that name none
    lineage_topic: str | None = None  # OpenLineage events of every run go here (None: no lineage)
    lineage_bootstrap: str | None = None  # the Kafka of that topic (default: kafka_bootstrap)
    lineage_namespace: str = "fibers"  # the OpenLineage job namespace
    policy: PodPolicy = podpolicy.OPEN  # what a spec may ask of its pods (images, ServiceAccounts, hostPath)


def seek_checkpoint(location: str, nonce: str) -> str:
    """A streaming query's checkpoint location after a seek: a fresh one per seek, so the query starts from
    the seek's position (Spark resumes from a checkpoint and ignores where to start); the old one stays."""
    return f"{location.rstrip('/')}-seek-{hashlib.sha256(nonce.encode()).hexdigest()[:8]}"


def spec_hash(spec: dict[str, Any]) -> str:
    """Hash of what a run is made from; fields that only steer runs are left out."""
    steering = {
        "state",
        "rerunNonce",
        "seek",
        "schedule",
        "concurrencyPolicy",
        "successfulRunsHistoryLimit",
        "failedRunsHistoryLimit",
        "submissionDeadlineSeconds",
        "queue",  # where the next run waits, not what it computes
        "restartOnSecretChange",
    }
    relevant = {k: v for k, v in spec.items() if k not in steering}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:10]


def secret_env_name(kind: str, name: str) -> str:
    """Environment variable carrying a MongoDB URI into the driver (set from a secretKeyRef)."""
    return f"FIBERS_{kind.upper()}_{name.upper()}_URI"


def render_job(
    spec: dict[str, Any],
    *,
    name: str,
    namespace: str,
    run: str,
    ref_topics: dict[str, list[str]],
    defaults: Defaults,
    avro: dict[str, dict[str, Any]] | None = None,
    run_id: str | None = None,
    seek: dict[str, Any] | None = None,
    seek_nonce: str | None = None,
) -> dict[str, Any]:
    """The JSON the job (fibers.jobs.transform) runs from. It never contains a secret value.

    `ref_topics` holds, by input name, the topics behind each connectRef and transformRef input (as the
    referenced resource reports them). `avro` holds, by input name (and "output" for the output), what
    the reconciler found for Avro inputs: the registry's URL, the subject, and the reader schema of a schemaRef.
    `seek`: spec.seek, for the run it started (every Kafka input then starts from its startFrom);
    `seek_nonce`: the last seek done (a streaming query's checkpoint location is then that seek's own).
    """
    avro = avro or {}
    inputs: list[dict[str, Any]] = []
    uses_kafka = False
    for item in spec["inputs"]:
        view: dict[str, Any] = {"name": item["name"]}
        if "kafka" in item:
            view["kafka"] = {k: v for k, v in item["kafka"].items() if k != "avro"}
            uses_kafka = True
        elif ref := item.get("connectRef") or item.get("transformRef"):
            topics = ref_topics.get(item["name"]) or []
            kind = "Connect" if "connectRef" in item else "Transform"
            if not topics:
                what = "has not reported any topics yet" if "connectRef" in item else "has no Kafka output"
                raise InputsNotReady(f"input {item['name']}: {kind} {ref['name']} {what}")
            view["kafka"] = {"topics": topics, "startingOffsets": "earliest"}
            view["kafka"]["producer"] = {"kind": kind, "name": ref["name"], "namespace": namespace}  # for lineage
            if ref.get("schema"):
                view["kafka"]["schema"] = ref["schema"]
            uses_kafka = True
        start = (seek or {}).get("startFrom") or item.get("startFrom")
        if "kafka" in view and start:
            view["kafka"].pop("startingOffsets", None)
            view["kafka"]["startFrom"] = dict(start)
        if "kafka" in view and item["name"] in avro:
            view["kafka"]["avro"] = avro[item["name"]]
        elif "files" in item:
            view["files"] = dict(item["files"])
        elif "mongodb" in item:
            mongo = item["mongodb"]
            view["mongodb"] = {
                "uriEnv": secret_env_name("input", item["name"]),
                "database": mongo["database"],
                "collection": mongo["collection"],
            }
        inputs.append(view)

    job: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "run": run,
        "mode": spec.get("mode", "batch"),
        "inputs": inputs,
        "sparkConf": dict((spec.get("spark") or {}).get("sparkConf") or {}),
        "resultConfigMap": result_config_map(run),
        "output": None,
        "streamBack": spec.get("streamBack"),
    }
    job["sql" if "sql" in spec else "entrypoint"] = spec.get("sql") or spec.get("entrypoint")
    output = spec.get("output") or {}
    if "kafka" in output:
        job["output"] = {"kafka": {k: v for k, v in output["kafka"].items() if k != "avro"}}
        if "output" in avro:
            job["output"]["kafka"]["avro"] = avro["output"]
        uses_kafka = True
    elif "files" in output:
        job["output"] = {"files": dict(output["files"])}
    elif "mongodb" in output:
        mongo = output["mongodb"]
        job["output"] = {
            "mongodb": {
                "uriEnv": secret_env_name("output", "result"),
                "database": mongo["database"],
                "collection": mongo["collection"],
                "idColumn": mongo.get("idColumn"),
            }
        }
    if spec.get("streamBack"):
        uses_kafka = True
    if spec.get("checkpoint"):
        job["checkpoint"] = dict(spec["checkpoint"])
        if seek_nonce:
            job["checkpoint"]["location"] = seek_checkpoint(str(spec["checkpoint"]["location"]), seek_nonce)
    if spec.get("outputMode"):
        job["outputMode"] = spec["outputMode"]
    lineage_bootstrap = defaults.lineage_bootstrap or defaults.kafka_bootstrap
    if defaults.lineage_topic and lineage_bootstrap and run_id:
        job["lineage"] = {
            "topic": defaults.lineage_topic,
            "bootstrapServers": lineage_bootstrap,
            "namespace": defaults.lineage_namespace,
            "job": f"{namespace}.transform.{name}",
            "runId": run_id,
        }
    if uses_kafka:
        bootstrap = (spec.get("kafka") or {}).get("bootstrapServers") or defaults.kafka_bootstrap
        if not bootstrap:
            raise ValueError("spec.kafka.bootstrapServers is not set and the operator has no default Kafka")
        job["kafka"] = {"bootstrapServers": bootstrap}
    return job


def avro_refs(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The `avro` blocks of Kafka and connectRef inputs (by input name) and of a Kafka output ("output")."""
    refs = {
        item["name"]: dict(source["avro"])
        for item in spec["inputs"]
        for source in (item.get("kafka") or item.get("connectRef") or item.get("transformRef") or {},)
        if source.get("avro") is not None
    }
    output = (spec.get("output") or {}).get("kafka") or {}
    if output.get("avro") is not None:
        refs["output"] = dict(output["avro"])
    return refs


def default_subject(item: dict[str, Any], ref_topics: dict[str, list[str]]) -> str:
    """TopicNameStrategy, as the converters use by default: the value subject of the input's first topic."""
    topics = item["kafka"]["topics"] if "kafka" in item else ref_topics.get(item["name"]) or []
    if not topics:
        raise InputsNotReady(f"input {item['name']}: no topic to take the subject from")
    return f"{sorted(topics)[0]}-value"


def secret_envs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Environment variables taken from Secrets (MongoDB URIs), by reference: driver and executors get them."""
    env = []
    for item in spec["inputs"]:
        if "mongodb" in item:
            ref = item["mongodb"]["uriSecretRef"]
            env.append(
                {
                    "name": secret_env_name("input", item["name"]),
                    "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}},
                }
            )
    output = spec.get("output") or {}
    if "mongodb" in output:
        ref = output["mongodb"]["uriSecretRef"]
        env.append(
            {
                "name": secret_env_name("output", "result"),
                "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}},
            }
        )
    return env


WHOLE_SECRET = ""  # the key of a Secret mounted as a volume: every key of it reaches the pods


def secret_keys(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The Secret keys (name, key) the runs' pods take, in a stable order: MongoDB URIs by reference, and
    Secrets mounted through spark.volumes (a `secret` volume, or a `projected` one's secret sources) whole."""
    refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"]) for e in secret_envs(spec)}
    for volume in (spec.get("spark") or {}).get("volumes") or []:
        if name := (volume.get("secret") or {}).get("secretName"):
            refs.add((str(name), WHOLE_SECRET))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if name := (source.get("secret") or {}).get("name"):
                refs.add((str(name), WHOLE_SECRET))
    return sorted(refs)


def restarts_on_secret_change(spec: dict[str, Any]) -> bool:
    """A streaming Transform asking to restart when a Secret it names changes, and naming one."""
    return spec.get("mode") == "streaming" and bool(spec.get("restartOnSecretChange")) and bool(secret_keys(spec))


# Stand-ins for what referenced resources supply at run time (a Connect's topics, a registry's URL):
# `problem` checks the Transform's own fields, not whether what it points at is ready.
_PLACEHOLDER_TOPIC = "fibers-placeholder-topic"
_PLACEHOLDER_AVRO = {"registryUrl": "http://fibers-placeholder-registry", "subject": "fibers-placeholder-value"}


def problem(spec: dict[str, Any], *, name: str, namespace: str, defaults: Defaults) -> str:
    """Why this Transform cannot run, naming the field ("" when it can).

    The CRD refuses what a schema can; this catches what passes admission but would make the driver
    exit (a cron field out of range, a streaming output that only batch supports, …), using the same
    checks the driver runs on the spec it is given.
    """
    spark = spec.get("spark") or {}
    refused = defaults.policy.problems(
        image=("spec.spark.image", spark.get("image")),
        service_account=("spec.spark.serviceAccount", spark.get("serviceAccount")),
        volumes=("spec.spark.volumes", spark.get("volumes") or []),
        spark_conf=("spec.spark.sparkConf", spark.get("sparkConf") or {}),
    )
    if refused:
        return "; ".join(refused)
    schedule = spec.get("schedule")
    if schedule:
        try:  # both directions: "0 0 30 2 *" parses but has no slot to find
            slots = croniter(schedule, datetime.now(UTC))
            slots.get_prev(datetime)
            slots.get_next(datetime)
        except (ValueError, KeyError) as exc:  # croniter's errors are ValueErrors; a bad macro can be a KeyError
            return f"spec.schedule: {schedule!r} is not a usable cron expression: {exc}"
    topics = {item["name"]: [_PLACEHOLDER_TOPIC] for item in spec.get("inputs") or [] if "name" in item}
    try:
        job = render_job(
            spec,
            name=name,
            namespace=namespace,
            run=name,
            ref_topics=topics,
            defaults=defaults,
            avro={key: dict(_PLACEHOLDER_AVRO) for key in avro_refs(spec)},
        )
        JobSpec.from_dict(job)
    except (SpecError, ValueError) as exc:
        return str(exc)
    return ""
