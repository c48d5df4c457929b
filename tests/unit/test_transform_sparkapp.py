"""The SparkApplication of a run, as the real Spark Operator (v2.5.0) takes it, and its status as Fibers reads it."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from fibers import settings
from fibers.conditions import format_time
from fibers.transform import runs, sparkapp
from fibers.transform.report import mirror_run, report, resolved_inputs
from fibers.transform.runs import TransformView
from fibers.transform.spec import WHOLE_SECRET, Defaults, render_job, restarts_on_secret_change, secret_keys, spec_hash

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
SECURE = {"runAsNonRoot", "runAsUser", "runAsGroup", "readOnlyRootFilesystem", "allowPrivilegeEscalation"}


def transform(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "fibers.dev/v1beta1",
        "kind": "Transform",
        "metadata": {
            "name": "orders-report",
            "namespace": "shop",
            "uid": "0b7c5e1e-1111-2222-3333-444455556666",
            "generation": 1,
            "creationTimestamp": format_time(NOW - timedelta(minutes=10)),
        },
        "spec": {
            "inputs": [
                {"name": "orders", "kafka": {"topics": ["orders"]}},
                {
                    "name": "people",
                    "mongodb": {"uriSecretRef": {"name": "mongo", "key": "uri"}, "database": "d", "collection": "p"},
                },
            ],
            "sql": "SELECT * FROM orders",
            "output": {
                "mongodb": {"uriSecretRef": {"name": "mongo-out", "key": "uri"}, "database": "d", "collection": "c"}
            },
        },
    }
    body["spec"].update(spec)
    return body


def streaming_transform(**spec: Any) -> dict[str, Any]:
    """A streaming Transform: one Kafka input, a Kafka output, a checkpoint."""
    return transform(
        mode="streaming",
        checkpoint={"location": "/c"},
        inputs=[{"name": "o", "kafka": {"topics": ["o"]}}],
        output={"kafka": {"topic": "x"}},
        **spec,
    )


def build(
    body: dict[str, Any] | None = None, defaults: Defaults | None = None, trigger: str = "create"
) -> dict[str, Any]:
    body = body or transform()
    defaults = defaults or Defaults(kafka_bootstrap="kafka:9092", service_account="fibers-job")
    job = render_job(
        body["spec"],
        name="orders-report",
        namespace="shop",
        run="orders-report-1a2b3c4d",
        ref_topics={},
        defaults=defaults,
    )
    return sparkapp.build(body, run="orders-report-1a2b3c4d", job=job, trigger=trigger, defaults=defaults)


def container(app: dict[str, Any], side: str) -> dict[str, Any]:
    [only] = app["spec"][side]["template"]["spec"]["containers"]
    return dict(only)


# --- what reaches the pods -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("side", "name"), [("driver", "spark-kubernetes-driver"), ("executor", "spark-kubernetes-executor")]
)
def test_pod_templates_carry_secret_refs_security_and_tmp_for_driver_and_executors(side: str, name: str) -> None:
    """Spark builds pods from the templates, so this arrives with or without the Spark Operator's webhook."""
    app = build()
    template = app["spec"][side]["template"]["spec"]
    main = container(app, side)
    assert main["name"] == name
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in main["env"]}
    assert refs == {
        "FIBERS_INPUT_PEOPLE_URI": {"name": "mongo", "key": "uri"},
        "FIBERS_OUTPUT_RESULT_URI": {"name": "mongo-out", "key": "uri"},
    }
    pod_sc, sc = template["securityContext"], main["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["fsGroup"] == 10001
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(sc) >= SECURE
    assert (sc["runAsUser"], sc["runAsGroup"], sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"]) == (
        10001,
        10001,
        True,
        False,
    )
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "emptyDir": {}} in template["volumes"]
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]


def test_nothing_the_webhook_would_apply_a_second_time() -> None:
    """The webhook appends driver.env and spec.volumes to the pod: a second `tmp` volume is a rejected pod."""
    spec = build()["spec"]
    assert "volumes" not in spec
    for side in ("driver", "executor"):
        assert not {"env", "envFrom", "volumeMounts", "securityContext", "podSecurityContext", "envVars"} & set(
            spec[side]
        ), side


def test_no_secret_value_anywhere_and_only_references() -> None:
    app = build()
    for side in ("driver", "executor"):
        for env in container(app, side)["env"]:
            assert set(env) == {"name", "valueFrom"} and set(env["valueFrom"]) == {"secretKeyRef"}
    text = json.dumps(app)
    assert "mongodb://" not in text and "uriSecretRef" not in text


def test_spark_volumes_reach_both_pods_next_to_tmp() -> None:
    volumes = [{"name": "data", "hostPath": {"path": "/srv/data", "type": "Directory"}}]
    mounts = [{"name": "data", "mountPath": "/data"}]
    app = build(transform(spark={"volumes": volumes, "volumeMounts": mounts}))
    for side in ("driver", "executor"):
        assert [v["name"] for v in app["spec"][side]["template"]["spec"]["volumes"]] == ["tmp", "data"]
        assert container(app, side)["volumeMounts"][1:] == mounts


def test_only_the_driver_gets_an_api_token_and_both_run_as_the_job_account() -> None:
    spec = build()["spec"]
    assert spec["driver"]["serviceAccount"] == spec["executor"]["serviceAccount"] == "fibers-job"
    assert "automountServiceAccountToken" not in spec["driver"]["template"]["spec"]
    assert spec["executor"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_pull_policy_core_request_and_memory_defaults() -> None:
    spec = build()["spec"]
    assert spec["imagePullPolicy"] == "IfNotPresent"
    assert spec["sparkVersion"] == "4.0.0"
    for side in ("driver", "executor"):
        assert (spec[side]["coreRequest"], spec[side]["memory"], spec[side]["cores"]) == ("200m", "512m", 1)
        assert spec[side]["labels"] == {"fibers.dev/transform": "orders-report"}
    assert spec["executor"]["instances"] == 1

    own = build(
        transform(spark={"driver": {"coreRequest": "500m", "memory": "1g"}, "executor": {"coreRequest": "1"}}),
        Defaults(kafka_bootstrap="k:9092", image_pull_policy="Never", core_request=None),
    )["spec"]
    assert own["imagePullPolicy"] == "Never"
    assert (own["driver"]["coreRequest"], own["driver"]["memory"], own["executor"]["coreRequest"]) == (
        "500m",
        "1g",
        "1",
    )
    none = build(defaults=Defaults(kafka_bootstrap="k:9092", core_request=None))["spec"]
    assert "coreRequest" not in none["driver"] and "coreRequest" not in none["executor"]
    assert "serviceAccount" not in none["driver"]


def test_the_operator_defaults_come_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FIBERS_JOB_IMAGE_PULL_POLICY", "FIBERS_SPARK_CORE_REQUEST", "FIBERS_JOB_IMAGE"):
        monkeypatch.delenv(name, raising=False)
    defaults = settings.transform_defaults()
    assert (defaults.image_pull_policy, defaults.core_request) == ("IfNotPresent", "200m")
    monkeypatch.setenv("FIBERS_JOB_IMAGE_PULL_POLICY", "Never")
    monkeypatch.setenv("FIBERS_SPARK_CORE_REQUEST", "")
    monkeypatch.setenv("FIBERS_JOB_IMAGE", "")
    defaults = settings.transform_defaults()
    assert (defaults.image_pull_policy, defaults.core_request, defaults.image) == ("Never", None, Defaults.image)
    monkeypatch.setenv("FIBERS_JOB_IMAGE_PULL_POLICY", "Sometimes")
    with pytest.raises(ValueError, match="FIBERS_JOB_IMAGE_PULL_POLICY"):
        settings.transform_defaults()


def test_kafka_jars_are_on_the_class_path_spark_submit_builds() -> None:
    conf = build(transform(spark={"sparkConf": {"spark.executor.extraClassPath": "/opt/extra/*"}}))["spec"]["sparkConf"]
    assert conf["spark.driver.extraClassPath"] == "/opt/fibers/jars/*"
    assert conf["spark.executor.extraClassPath"] == "/opt/extra/*:/opt/fibers/jars/*"
    assert "spark.kubernetes.executor.deleteOnTermination" not in conf  # Spark's default: executors go


def test_restart_policy_and_no_ttl() -> None:
    batch = build()["spec"]
    assert batch["restartPolicy"] == {"type": "Never"} and "timeToLiveSeconds" not in batch
    streaming = build(streaming_transform())["spec"]
    assert streaming["restartPolicy"]["type"] == "OnFailure"


def test_a_streaming_driver_serves_its_metrics_on_a_named_port_and_a_batch_driver_does_not() -> None:
    spec = build(streaming_transform())["spec"]
    [driver] = spec["driver"]["template"]["spec"]["containers"]
    assert driver["ports"] == [{"name": "metrics", "containerPort": 9405, "protocol": "TCP"}]
    assert {"name": "FIBERS_METRICS_PORT", "value": "9405"} in driver["env"]
    [executor] = spec["executor"]["template"]["spec"]["containers"]
    assert "ports" not in executor and all(e["name"] != "FIBERS_METRICS_PORT" for e in executor.get("env", []))
    [batch] = build()["spec"]["driver"]["template"]["spec"]["containers"]
    assert "ports" not in batch


def test_run_names_are_dns_1035_labels() -> None:
    for name in ("orders-report", "orders.v2", "9lives", "a" * 253):
        run = runs.run_name(name, "uid", "create/abc")
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", run) and len(run) <= 63, run
    assert runs.run_name("orders-report", "uid", "k").startswith("orders-report-")  # valid names unchanged


# --- conformance with the real CRD ---------------------------------------------------------------


def _spark_operator_crd() -> dict[str, Any]:
    """The real SparkApplication CRD, from the Spark Operator's module (downloaded here when missing: a
    fresh clone checks against it too, or fails saying why, never skips)."""
    from fibers_stack import fetch

    path = fetch.spark_operator_source() / "config" / "crd" / "bases" / "sparkoperator.k8s.io_sparkapplications.yaml"
    crd = yaml.safe_load(path.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "boolean": bool,
    "object": dict,
    "array": list,
    "number": (int, float),
}


def schema_errors(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Structural check: every field exists in the schema, with its type, enum, minimum and required fields."""
    errors: list[str] = []
    kind = schema.get("type")
    if (kind and not isinstance(value, TYPES[kind])) or (kind == "integer" and isinstance(value, bool)):
        return [f"{where or '.'}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        errors += [f"{where}.{key}: required" for key in schema.get("required", []) if key not in value]
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return errors
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        if props is None and extra is None:
            return errors  # metadata: type object only
        for key, item in value.items():
            if props is not None and key in props:
                errors += schema_errors(item, props[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, f"{where}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{where}.{key}: no such field")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


def model_errors(value: Any, type_name: str, where: str) -> list[str]:
    """Check a Kubernetes object (the preserve-unknown-fields pod templates) against the client's models."""
    if type_name.startswith("List["):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [e for i, item in enumerate(value) for e in model_errors(item, type_name[5:-1], f"{where}[{i}]")]
    if type_name.startswith("Dict["):
        inner = type_name[5:-1].split(", ", 1)[1]
        if not isinstance(value, dict):
            return [f"{where}: not a map"]
        return [e for k, item in value.items() for e in model_errors(item, inner, f"{where}.{k}")]
    scalars: dict[str, type | tuple[type, ...]] = {
        "str": str,
        "int": int,
        "bool": bool,
        "object": object,
        "float": (int, float),
    }
    if type_name in scalars:
        return [] if isinstance(value, scalars[type_name]) else [f"{where}: {value!r} is not {type_name}"]
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        return [f"{where}: not an object ({type_name})"]
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = []
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{where}.{key}: no such field in {type_name}")
        else:
            errors += model_errors(item, model.openapi_types[by_json[key]], f"{where}.{key}")
    return errors


def test_the_app_conforms_to_the_real_spark_operator_crd() -> None:
    schema = _spark_operator_crd()
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    bodies = [
        transform(),
        transform(
            spark={"volumes": volumes, "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}
        ),
        streaming_transform(spark={"driver": {"cores": 2, "coreRequest": "0.5"}, "executor": {"instances": 3}}),
        transform(queue="batch"),  # spec.suspend: the Spark Operator 2.4+ field
    ]
    for body in bodies:
        app = build(body)
        assert schema_errors(app, schema) == []
        for side in ("driver", "executor"):
            template = app["spec"][side]["template"]
            assert model_errors(template, "V1PodTemplateSpec", f"spec.{side}.template") == []


def test_the_structural_check_catches_what_the_crd_would_not_take() -> None:
    schema = _spark_operator_crd()
    app = build()
    wrong = copy.deepcopy(app)
    wrong["spec"]["driver"]["env"] = [{"name": "X", "value": "y"}]  # exists: fine
    wrong["spec"]["pythonVersion"] = "4"
    wrong["spec"]["driver"]["coreRequests"] = "1"
    wrong["spec"]["restartPolicy"]["type"] = "Sometimes"
    assert sorted(schema_errors(wrong, schema)) == [
        ".spec.driver.coreRequests: no such field",
        ".spec.pythonVersion: '4' not in ['2', '3']",
        ".spec.restartPolicy.type: 'Sometimes' not in ['Never', 'Always', 'OnFailure']",
    ]
    assert model_errors({"spec": {"containers": [{"name": "c", "envs": []}]}}, "V1PodTemplateSpec", "t") == [
        "t.spec.containers[0].envs: no such field in V1Container"
    ]


def test_status_fibers_writes_conforms_to_the_transform_crd() -> None:
    crd = yaml.safe_load((REPO / "crds" / "transforms.fibers.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    view = TransformView(transform())
    current = {"name": "orders-report-1a2b3c4d", "submittedAt": format_time(NOW), "specHash": "x", "trigger": "create"}
    for app in (
        app_with("RUNNING", executorState={"e-1": "RUNNING", "e-2": "PENDING"}),
        app_with("FAILED", error="driver container failed with ExitCode: 1, Reason: Error"),
        app_with(""),
    ):
        run = mirror_run(current, app, {"error": "[TABLE_OR_VIEW_NOT_FOUND] …"})
        status = report(view, run, NOW)
        assert schema_errors({"spec": transform()["spec"], "status": status}, schema) == []


# --- the Spark Operator's status -----------------------------------------------------------------


def app_with(state: str, *, error: str = "", **status: Any) -> dict[str, Any]:
    app = build()
    app["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(minutes=10))
    app["status"] = {
        "applicationState": {"state": state, **({"errorMessage": error} if error else {})},
        "driverInfo": {"podName": "orders-report-1a2b3c4d-driver"},
        "submissionAttempts": 1,
        "executionAttempts": 1,
        "lastSubmissionAttemptTime": format_time(NOW - timedelta(minutes=9)),
        **status,
    }
    if not state:
        del app["status"]["executionAttempts"]
    return app


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_a_failed_runs_condition_carries_sparks_message_from_the_result_config_map() -> None:
    view = TransformView(transform())
    current = {"name": "orders-report-1a2b3c4d", "submittedAt": format_time(NOW - timedelta(minutes=10))}
    app = app_with(
        "FAILED",
        error="driver container failed with ExitCode: 1, Reason: Error",
        terminationTime=format_time(NOW),
    )
    spark_error = "[TABLE_OR_VIEW_NOT_FOUND] The table or view `no_such_view` cannot be found."
    status = report(view, mirror_run(current, app, {"error": spark_error}), NOW)
    cond = ready(status)
    assert (status["phase"], cond["status"], cond["reason"]) == ("Failed", "False", "RunFailed")
    assert "TABLE_OR_VIEW_NOT_FOUND" in cond["message"]
    assert status["currentRun"]["errorMessage"] == spark_error
    assert status["currentRun"]["finishedAt"] == format_time(NOW)

    # Without a word from the job (it was killed), the Spark Operator's message is what there is.
    status = report(view, mirror_run(current, app, {}), NOW)
    assert "ExitCode: 1" in ready(status)["message"]


def test_failing_and_submission_failed_are_not_final() -> None:
    assert not sparkapp.finished(app_with("FAILING")) and not sparkapp.finished(app_with("SUBMISSION_FAILED"))
    assert sparkapp.finished(app_with("FAILED")) and sparkapp.finished(app_with("COMPLETED"))
    view = TransformView(transform())
    current = {"name": "orders-report-1a2b3c4d"}
    run = mirror_run(current, app_with("FAILING", error="driver container failed"), {"error": "boom"})
    status = report(view, run, NOW)
    cond = ready(status)
    assert (cond["reason"], status["phase"]) == ("RunFailing", "Running") and "boom" in cond["message"]
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "False"


def test_running_reports_driver_attempts_and_executors() -> None:
    view = TransformView(transform())
    app = app_with("RUNNING", executorState={"x-exec-1": "RUNNING", "x-exec-2": "RUNNING", "x-exec-3": "FAILED"})
    run = mirror_run({"name": "orders-report-1a2b3c4d"}, app, {})
    assert run["driverPod"] == "orders-report-1a2b3c4d-driver" and run["attempts"] == 1
    assert run["executors"] == {"FAILED": 1, "RUNNING": 2}
    assert "executors: 1 failed, 2 running" in ready(report(view, run, NOW))["message"]
    # What the Spark Operator says of an executor whose pod went while the driver runs (seen on the stack).
    lost = mirror_run({"name": "x"}, app_with("RUNNING", executorState={"x-exec-1": "UNKNOWN"}), {})
    assert "executors: 1 lost" in ready(report(view, lost, NOW))["message"]
    fresh = mirror_run({"name": "orders-report-1a2b3c4d"}, app_with(""), {})
    assert fresh["applicationState"] == runs.NEW
    assert "waiting for the Spark Operator" in ready(report(view, fresh, NOW))["message"]


def submitted_run(ago: timedelta) -> dict[str, Any]:
    """A Transform with a 60 s submission deadline whose current run was submitted `ago`."""
    body = transform(submissionDeadlineSeconds=60)
    body["status"] = {
        "currentRun": {
            "name": "orders-report-1a2b3c4d",
            "specHash": spec_hash(body["spec"]),
            "submittedAt": format_time(NOW - ago),
        }
    }
    return body


def test_the_submission_deadline_watches_the_state_not_the_driver_pod_name() -> None:
    """The Spark Operator names driverInfo.podName when it submits, long before the driver runs."""
    body = submitted_run(ago=timedelta(minutes=10))
    view = TransformView(body)
    pending = app_with("SUBMITTED")  # driver pod named and pending for 9 minutes
    plan = runs.plan(view, [pending], NOW)
    assert plan.deadline_failed.startswith("no driver started within 60s")
    assert plan.delete == [pending["metadata"]["name"]]
    assert not runs.plan(view, [app_with("RUNNING")], NOW).deadline_failed
    # A restarted streaming attempt is measured from its own submission.
    resubmitted = app_with("SUBMITTED", lastSubmissionAttemptTime=format_time(NOW - timedelta(seconds=20)))
    assert not runs.plan(view, [resubmitted], NOW).deadline_failed
    never_taken_up = app_with("")
    del never_taken_up["status"]
    assert "does it watch namespace shop" in runs.plan(view, [never_taken_up], NOW).deadline_failed


def test_a_pod_that_will_not_start_is_the_runs_ready_and_its_deadline_failure_says_why() -> None:
    view = TransformView(transform(submissionDeadlineSeconds=60))
    run = mirror_run({"name": "orders-report-1a2b3c4d"}, app_with("SUBMITTED"), {})
    trouble = {"pod": "orders-report-1a2b3c4d-driver", "reason": "ImagePullBackOff", "message": "Back-off pulling"}
    said = ready(report(view, {**run, "podTrouble": trouble}, NOW))
    assert (said["reason"], said["message"]) == (
        "ImagePullBackOff",
        "run orders-report-1a2b3c4d: pod orders-report-1a2b3c4d-driver: Back-off pulling",
    )
    body = submitted_run(ago=timedelta(minutes=2))
    plan = runs.plan(TransformView(body), [app_with("SUBMITTED")], NOW, "pod d: ImagePullBackOff: Back-off pulling")
    assert (
        plan.deadline_failed == "no driver started within 60s of submission: pod d: ImagePullBackOff: Back-off pulling"
    )


# --- the chart -----------------------------------------------------------------------------------


def _job_rules(define: str = "fibers.jobRules") -> dict[str, set[str]]:
    """A pod ServiceAccount's verbs by resource (`group/resource` outside the core group)."""
    text = (REPO / "charts" / "fibers" / "templates" / "_helpers.tpl").read_text()
    block = text.split(f'{{{{- define "{define}" -}}}}', 1)[1].split("{{- end }}", 1)[0]
    rules: dict[str, set[str]] = {}
    for rule in yaml.safe_load(block):
        [group] = rule["apiGroups"]
        for resource in rule["resources"]:
            rules.setdefault(f"{group}/{resource}" if group else resource, set()).update(rule["verbs"])
    return rules


def test_the_job_role_lets_a_spark_driver_run_its_executors() -> None:
    rules = _job_rules()
    assert {"get", "list", "watch", "create", "patch", "delete", "deletecollection"} <= rules["pods"]
    # the result ConfigMap (create or replace) and the executors' ConfigMap (create, delete by label)
    assert {"get", "create", "update", "list", "delete", "deletecollection"} <= rules["configmaps"]
    assert {"list", "delete", "deletecollection"} <= rules["services"]
    assert {"list", "delete", "deletecollection"} <= rules["persistentvolumeclaims"]
    assert "secrets" not in rules  # secrets reach pods as references, never through the API


def test_consumer_pods_hold_partition_leases_and_their_checkpoints_and_nothing_else() -> None:
    """A consumer pod runs the namespace user's callback: none of the Spark driver's rights (pods, services)."""
    rules = _job_rules("fibers.consumerRules")
    assert rules == {
        "coordination.k8s.io/leases": {"get", "create", "update"},
        "configmaps": {"get", "create", "update"},
        "apps/statefulsets": {"get"},  # the number of instances, read; nothing else of the workload
    }
    assert "coordination.k8s.io/leases" not in _job_rules()  # and a Spark driver holds no Lease


def test_the_example_transforms_fit_both_crds() -> None:
    """examples/ against our Transform CRD, and the SparkApplications they make against the Spark Operator's."""
    spark_schema = _spark_operator_crd()
    crd = yaml.safe_load((REPO / "crds" / "transforms.fibers.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    examples = [
        doc
        for path in sorted((REPO / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Transform"
    ]
    assert examples
    for example in examples:
        assert schema_errors(example, schema) == [], example["metadata"]["name"]
        body = copy.deepcopy(example)
        body["metadata"].update(namespace="shop", uid="u")
        job = render_job(
            body["spec"],
            name=body["metadata"]["name"],
            namespace="shop",
            run="r-1",
            ref_topics={item["name"]: ["shop.public.orders"] for item in body["spec"]["inputs"]},
            defaults=Defaults(kafka_bootstrap="kafka:9092"),
        )
        app = sparkapp.build(body, run="r-1", job=job, trigger="create", defaults=Defaults())
        assert schema_errors(app, spark_schema) == [], example["metadata"]["name"]


def test_lineage_reaches_the_job_only_when_the_operator_has_a_topic() -> None:
    body = transform()
    args = {"name": "orders-report", "namespace": "shop", "run": "r-1", "ref_topics": {}, "run_id": "u-1"}
    plain = render_job(body["spec"], defaults=Defaults(kafka_bootstrap="kafka:9092"), **args)
    assert "lineage" not in plain
    on = Defaults(kafka_bootstrap="kafka:9092", lineage_topic="lin", lineage_namespace="prod")
    job = render_job(body["spec"], defaults=on, **args)
    assert job["lineage"] == {
        "topic": "lin",
        "bootstrapServers": "kafka:9092",
        "namespace": "prod",
        "job": "shop.transform.orders-report",
        "runId": "u-1",
    }


def test_a_run_no_spark_operator_takes_up_is_stalled_naming_the_namespace() -> None:
    """A SparkApplication in a namespace the Spark Operator does not watch never gets a status at all."""
    view = TransformView(transform())
    untouched = {"metadata": build()["metadata"]}  # no status: nobody took it up
    current = {"name": "orders-report-1a2b3c4d", "submittedAt": format_time(NOW - timedelta(seconds=30))}
    soon = ready(report(view, mirror_run(current, untouched, {}), NOW))
    assert (soon["status"], soon["reason"]) == ("False", "Submitted")  # it may just be slow
    current["submittedAt"] = format_time(NOW - runs.UNTOUCHED_AFTER - timedelta(seconds=1))
    status = report(view, mirror_run(current, untouched, {}), NOW)
    cond, stalled = ready(status), next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (cond["status"], cond["reason"], stalled["status"]) == ("False", runs.NOT_TAKEN_UP, "True")
    assert f"namespace {view.body['metadata']['namespace']}" in cond["message"]
    assert "spark.jobNamespaces" in cond["message"]
    # Taken up at last (a SUBMITTED state): back to waiting for the driver.
    taken = app_with("SUBMITTED")
    assert ready(report(view, mirror_run(current, taken, {}), NOW))["reason"] == "Submitted"


def test_no_spark_operator_in_the_cluster_is_stalled_whatever_the_last_run_did() -> None:
    view = TransformView(transform())
    status = report(view, {}, NOW, no_spark_operator="the cluster does not serve sparkapplications")
    cond = ready(status)
    assert (cond["status"], cond["reason"]) == ("False", runs.NO_SPARK_OPERATOR)
    assert "sparkapplications" in cond["message"]


def test_a_transform_looks_again_when_its_run_would_count_as_untouched() -> None:
    view = TransformView(transform())
    app = {"metadata": {**build()["metadata"], "creationTimestamp": format_time(NOW)}}
    view.body["status"] = {"currentRun": {"name": app["metadata"]["name"], "submittedAt": format_time(NOW)}}
    due = runs.next_look(view, [app], NOW)
    assert due is not None and timedelta(0) < due - (NOW + runs.UNTOUCHED_AFTER) < timedelta(seconds=1)


@pytest.mark.parametrize(
    ("spec", "trigger"),
    [({}, "rerun"), ({"schedule": "*/5 * * * *"}, "schedule"), ({"mode": "streaming"}, "create")],
)
def test_a_run_recorded_but_never_created_is_created_whatever_else_the_spec_says(
    spec: dict[str, Any], trigger: str
) -> None:
    """The operator stopped between the write-ahead status write and the create: the recorded run is created
    under its name. A scheduled Transform once went to its schedule's branch instead, and the slot recorded
    with the run was never run."""
    view = TransformView(transform(**spec))
    recorded = {"name": "orders-report-1a2b3c4d", "specHash": spec_hash(view.spec), "trigger": trigger}
    view.body["status"] = {"currentRun": recorded, "lastScheduleTime": format_time(NOW - timedelta(minutes=1))}
    assert runs.plan(view, [], NOW).start == ("orders-report-1a2b3c4d", trigger)
    # Once taken up (a state recorded), or for a spec changed since, it is not created again.
    view.body["status"]["currentRun"] = {**recorded, "applicationState": "COMPLETED"}
    assert runs.plan(view, [], NOW).start != ("orders-report-1a2b3c4d", trigger)
    view.body["status"]["currentRun"] = {**recorded, "specHash": "older"}
    assert runs.plan(view, [], NOW).start != ("orders-report-1a2b3c4d", trigger)


def test_a_seek_starts_one_run_whose_kafka_inputs_start_from_its_position() -> None:
    """spec.seek with a new nonce starts a run (replacing one still going); its Kafka inputs start from the
    seek's startFrom; the seek is not a spec change, and a seek already done starts nothing."""
    seek = {"nonce": "fix-1", "startFrom": {"timestamp": "2026-11-23T09:00:00Z"}}
    view = TransformView(transform(seek=seek))
    digest = spec_hash(view.spec)
    view.body["status"] = {"currentRun": {"name": "orders-report-old", "specHash": digest}}
    running = {**app_with("RUNNING"), "metadata": {**build()["metadata"], "name": "orders-report-old"}}
    plan = runs.plan(view, [running], NOW)
    assert plan.start is not None and plan.start[1] == "seek" and plan.seek_nonce == "fix-1"
    assert plan.delete == ["orders-report-old"]
    assert spec_hash(transform()["spec"]) == digest  # adding a seek changes nothing a run is made of
    view.body["status"]["lastSeekNonce"] = "fix-1"
    assert runs.plan(view, [running], NOW).start is None

    job = render_job(
        view.spec,
        name="orders-report",
        namespace="shop",
        run="r",
        ref_topics={},
        defaults=Defaults(kafka_bootstrap="k:9092"),
        seek=seek,
        seek_nonce="fix-1",
    )
    assert job["inputs"][0]["kafka"] == {"topics": ["orders"], "startFrom": seek["startFrom"]}


def test_after_a_seek_a_streaming_query_keeps_a_checkpoint_location_of_its_own() -> None:
    spec = transform(mode="streaming", checkpoint={"location": "/data/ckpt/orders/"})["spec"]
    spec["output"] = {"kafka": {"topic": "out"}}
    plain = render_job(spec, name="o", namespace="shop", run="r", ref_topics={}, defaults=Defaults("k:9092"))
    sought = render_job(
        spec, name="o", namespace="shop", run="r", ref_topics={}, defaults=Defaults("k:9092"), seek_nonce="fix-1"
    )
    assert plain["checkpoint"]["location"] == "/data/ckpt/orders/"
    assert re.fullmatch(r"/data/ckpt/orders-seek-[0-9a-f]{8}", sought["checkpoint"]["location"])


# --- queue admission (Kueue) ---------------------------------------------------------------------


def test_a_queued_run_is_created_suspended_labelled_with_its_queue_and_with_cpu_requests() -> None:
    app = build(transform(queue="batch"), Defaults(kafka_bootstrap="k:9092", core_request=None))
    assert app["metadata"]["labels"][sparkapp.QUEUE_LABEL] == "batch"
    assert app["spec"]["suspend"] is True and app["spec"]["mode"] == "cluster"
    # Kueue counts CPU from coreRequest only: without one, a run would take no quota at all.
    assert app["spec"]["driver"]["coreRequest"] == app["spec"]["executor"]["coreRequest"] == "1"
    assert app["spec"]["executor"]["instances"] == 1
    plain = build()
    assert "suspend" not in plain["spec"] and sparkapp.QUEUE_LABEL not in plain["metadata"]["labels"]
    # Moving a Transform to a queue steers its next run; it does not start one.
    assert spec_hash(transform(queue="batch")["spec"]) == spec_hash(transform()["spec"])


def queued_view(**spec: Any) -> TransformView:
    body = submitted_run(ago=timedelta(minutes=30))  # far past the 60 s submission deadline
    body["spec"].update(spec)
    body["status"]["currentRun"]["applicationState"] = runs.QUEUED
    return TransformView(body)


def test_a_run_waiting_for_admission_is_neither_resumed_nor_failed_by_the_deadline() -> None:
    """The Spark Operator says SUSPENDED for a run created suspended. Mirrored as is, that is the word
    Fibers records for a run it stopped itself, which the planner resumes with a new run: a queued run
    would be replaced by another queued run at each look, and the queue never drained."""
    view = queued_view(queue="batch")
    for state in sorted(sparkapp.SUSPENDED_BY_SPEC):
        app = app_with(state)
        run = mirror_run(view.current, app, {})
        assert run["applicationState"] == runs.QUEUED
        plan = runs.plan(view.with_status({**view.status, "currentRun": run}), [app], NOW)
        assert plan.start is None and not plan.deadline_failed and plan.delete == []
        # No deadline to wake up for; looked at again only to read what Kueue says (nothing watched moves).
        assert runs.next_look(view, [app], NOW) == NOW + runs.QUEUED_FIRST_LOOK
    said = view.with_status({**view.status, "currentRun": {**view.current, "admission": "insufficient quota"}})
    assert runs.next_look(said, [app_with("SUSPENDED")], NOW) == NOW + runs.QUEUED_LOOK


def test_the_status_says_which_queue_a_run_waits_in_and_what_kueue_says() -> None:
    view = queued_view(queue="batch")
    run = mirror_run(view.current, app_with("SUSPENDED"), {})
    run["admission"] = "couldn't assign flavors to pod set driver: insufficient unused quota for cpu"
    status = report(view, run, NOW)
    cond = ready(status)
    assert (status["phase"], cond["reason"]) == ("Pending", "WaitingForAdmission")
    assert cond["message"] == (
        "run orders-report-1a2b3c4d waiting for admission in queue batch: couldn't assign flavors to pod set "
        "driver: insufficient unused quota for cpu"
    )
    # Admitted: the Spark Operator resubmits; the admission note goes and the deadline counts from then.
    admitted = app_with("SUBMITTED", lastSubmissionAttemptTime=format_time(NOW - timedelta(seconds=5)))
    moved = mirror_run(run, admitted, {})
    assert "admission" not in moved and moved["applicationState"] == "SUBMITTED"
    assert not runs.plan(view, [admitted], NOW).deadline_failed


# --- Secret rotation -------------------------------------------------------------------------------


def test_the_secrets_a_transform_names_are_its_uris_and_the_secrets_it_mounts_whole() -> None:
    spark = {
        "volumes": [
            {"name": "tls", "secret": {"secretName": "kafka-tls"}},
            {"name": "p", "projected": {"sources": [{"secret": {"name": "extra"}}, {"configMap": {"name": "c"}}]}},
            {"name": "d", "emptyDir": {}},
        ]
    }
    assert secret_keys(transform(spark=spark)["spec"]) == [
        ("extra", WHOLE_SECRET),
        ("kafka-tls", WHOLE_SECRET),
        ("mongo", "uri"),
        ("mongo-out", "uri"),
    ]


def streaming_with_secret(digest_then: str, state: str = "RUNNING", **spec: Any) -> tuple[TransformView, list[Any]]:
    body = streaming_transform(spark={"volumes": [{"name": "tls", "secret": {"secretName": "kafka-tls"}}]}, **spec)
    app = app_with(state)
    body["status"] = {
        "currentRun": {
            "name": app["metadata"]["name"],
            "specHash": spec_hash(body["spec"]),
            "secretsDigest": digest_then,
            "applicationState": state,
        }
    }
    return TransformView(body), [app]


def test_a_streaming_run_restarts_for_a_moved_secret_only_when_its_spec_asks() -> None:
    view, apps = streaming_with_secret("aaaa", restartOnSecretChange=True)
    plan = runs.plan(view, apps, NOW, secrets_digest="bbbb")
    assert plan.start is not None and plan.start[1] == "secret-change"
    assert plan.delete == [apps[0]["metadata"]["name"]]  # one query at a time: the old run goes
    assert runs.plan(view, apps, NOW, secrets_digest="aaaa").start is None  # the values did not move
    assert runs.plan(view, apps, NOW).start is None  # not read: no Secret changed
    unasked, apps = streaming_with_secret("aaaa")
    assert runs.plan(unasked, apps, NOW, secrets_digest="bbbb").start is None
    assert not restarts_on_secret_change(unasked.spec) and restarts_on_secret_change(view.spec)
    ended, apps = streaming_with_secret("aaaa", state="FAILED", restartOnSecretChange=True)
    assert (runs.plan(ended, apps, NOW, secrets_digest="bbbb").start or ("", ""))[1] != "secret-change"
    # Asking for it changes what steers runs, not what they compute: no restart by itself.
    assert spec_hash(view.spec) == spec_hash(unasked.spec)


def test_the_status_says_which_topics_each_kafka_input_reads_as_resolved() -> None:
    """status.inputs was in the CRD and never written: a Replay could not count the records a Transform
    reading a Connect's topics (connectRef) would read again, and said nothing for it."""
    spec = transform(
        inputs=[
            {"name": "direct", "kafka": {"topics": ["a", "b"]}},
            {"name": "cdc", "connectRef": {"name": "orders-cdc"}},
            {"name": "later", "transformRef": {"name": "not-there-yet"}},
            {
                "name": "people",
                "mongodb": {"uriSecretRef": {"name": "m", "key": "uri"}, "database": "d", "collection": "p"},
            },
        ]
    )["spec"]
    resolved = resolved_inputs(spec, {1: ["shop.public.orders"]})
    assert resolved == [{"name": "direct", "topics": ["a", "b"]}, {"name": "cdc", "topics": ["shop.public.orders"]}]
    view = TransformView(transform())
    status = report(view, {}, NOW, inputs=resolved)
    assert status["inputs"] == resolved
    assert report(view.with_status(status), {}, NOW)["inputs"] == resolved  # kept when not resolved again
