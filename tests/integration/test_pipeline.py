"""The pipeline as one thing (real stack): typed references between kinds, UpstreamReady travelling
downstream, Events on degrading and recovering, and `fibers pipeline` naming the first broken link."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from fibers.consumer.mongo_servers import FEW_REPLACES
from fibers_stack import StackInfo
from tests.helpers import Resources, read_all, wait_for
from tests.integration.conftest import OperatorProcess

NEVER = "0 0 1 1 *"  # a batch Transform that waits for next New Year: it reports, and runs nothing meanwhile


@pytest.fixture
def connects(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "connects", namespace)


def fibers_pipeline(
    stack_info: StackInfo, name: str, *args: str, kubeconfig: str | None = None, argv: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`fibers pipeline NAME ARGS…` as a person runs it (or `argv` instead of `python -m fibers`)."""
    return subprocess.run(
        [*(argv or (sys.executable, "-m", "fibers")), "pipeline", name, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": kubeconfig or stack_info.kubeconfig},
    )


def merged_kubeconfig(stack_info: StackInfo, directory: Path, namespace: str) -> str:
    """KUBECONFIG as two files, as people keep them: the first names the current context and its
    namespace, the second (the stack's) holds the cluster and the user that context uses."""
    stack = yaml.safe_load(Path(stack_info.kubeconfig).read_text())
    [context] = stack["contexts"]
    first = directory / "first.yaml"
    mine = {**context["context"], "namespace": namespace}
    first.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "mine",
                "contexts": [{"name": "mine", "context": mine}],
            }
        )
    )
    return os.pathsep.join([str(first), stack_info.kubeconfig])


def file_source(path: Path, topic: str) -> dict[str, Any]:
    """Lines as records {"id": line}: a consumer keys each change by its id."""
    hoist = {"transforms": "hoist", "transforms.hoist.type": "org.apache.kafka.connect.transforms.HoistField$Value"}
    return {
        "class": "FileStreamSource",
        "config": {"file": str(path), "topic": topic, **hoist, "transforms.hoist.field": "id"},
        "autoRestart": {"enabled": False},
    }


def test_downstream_reports_its_failing_connect_and_recovers_with_it(
    connects: Resources,
    transforms: Resources,
    consumers: Resources,
    stack_info: StackInfo,
    namespace: str,
    tmp_path: Path,
    unique: str,
) -> None:
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"line {i}\n" for i in range(5)))
    src, view, report = f"{unique}-src", f"{unique}-view", f"{unique}-report"
    labels = {"fibers.dev/pipeline": unique}
    connects.create(src, file_source(source, unique), labels=labels)
    consumers.create(
        view,
        {"sourceRefs": [{"connectRef": {"name": src}}], "startPosition": "earliest", "sink": {"type": "log"}},
        labels=labels,
    )
    transforms.create(
        report,
        {
            "schedule": NEVER,
            "inputs": [{"name": "lines", "connectRef": {"name": src}}],
            "sql": "SELECT count(*) AS n FROM lines",
            "output": {"files": {"path": "/data/out", "format": "json"}},
        },
        labels=labels,
    )
    # The consumer's topics are the Connect's, resolved from its status, and it consumes them.
    status = consumers.wait_status(
        view, lambda s: s.get("eventsProcessed") == 5, timeout=180, what="the connector's 5 lines consumed"
    )
    assert status["sources"] == [unique]
    assert consumers.condition(view, "UpstreamReady")["message"] == f"Connect {src}: Ready"
    transforms.wait_condition(report, "True", "UpstreamReady", type_="UpstreamReady")
    # A pod may consume before its first readiness probe passes: the step is Ready once the kubelet says so.
    consumers.wait_condition(view, "True", timeout=60)
    # Through merged kubeconfig files, the namespace from the first one's context, as `kubectl fibers`.
    plugin = str(Path(sys.executable).parent / "kubectl-fibers")
    healthy = fibers_pipeline(
        stack_info, unique, kubeconfig=merged_kubeconfig(stack_info, tmp_path, namespace), argv=(plugin,)
    )
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    lines = healthy.stdout.splitlines()
    assert lines[0] == f"pipeline {namespace}/{unique}: 3 steps"
    assert [line.split()[1] for line in lines[2:5]] == [
        f"Connect/{src}",
        f"Transform/{report}",
        f"DatabusConsumer/{view}",
    ]
    assert lines[-1] == "every step is Ready"
    as_json = fibers_pipeline(stack_info, unique, "-A", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    [chain] = json.loads(as_json.stdout)  # every namespace: the pipeline is in this one only
    assert (chain["namespace"], chain["ready"], chain["firstBroken"]) == (namespace, True, None)
    assert [step["step"] for step in chain["steps"]] == [line.split()[1] for line in lines[2:5]]

    # A config whose task fails: the producer refuses the topic name of the next line, and the task stops.
    connects.patch(src, {"spec": {"config": {"topic": "not a topic!"}}})
    wait_for(lambda: (connects.status(src).get("observedGeneration") or 0) >= 2, timeout=30, what="config applied")
    with source.open("a") as lines:
        lines.write("line 5\n")
    connects.wait_condition(src, "False", "TasksFailed", timeout=90)
    for kind, name in ((consumers, view), (transforms, report)):
        cond = kind.wait_condition(name, "False", "UpstreamNotReady", type_="UpstreamReady", timeout=30)
        assert cond["message"].startswith(f"Connect {src} is not Ready (TasksFailed: ")
        ready = kind.condition(name)
        assert ready["status"] == "True", "UpstreamReady does not flip Ready by itself"
        assert f"upstream: Connect {src} is not Ready" in ready["message"]
        degraded = kind.wait_event(name, "UpstreamDegraded")
        assert degraded["type"] == "Warning" and src in degraded["message"]
    broken = fibers_pipeline(stack_info, unique, "-n", namespace)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    marked = [line for line in broken.stdout.splitlines() if line.startswith("✗")]
    assert [line.split()[1] for line in marked] == [f"Connect/{src}"]
    assert broken.stdout.splitlines()[-1].startswith(f"first broken link: Connect/{src}: TasksFailed: ")
    assert any(line.startswith("!") and f"DatabusConsumer/{view}" in line for line in broken.stdout.splitlines())

    # Fixed: the task runs again, and both say so.
    connects.patch(src, {"spec": {"config": {"topic": unique}}})
    connects.wait_condition(src, "True", "Running", timeout=90)
    for kind, name in ((consumers, view), (transforms, report)):
        kind.wait_condition(name, "True", "UpstreamReady", type_="UpstreamReady", timeout=30)
        assert "upstream:" not in kind.condition(name)["message"]
        assert kind.wait_event(name, "UpstreamRecovered")["type"] == "Normal"
    assert fibers_pipeline(stack_info, unique, "-n", namespace).returncode == 0

    # One word for the whole pipeline: suspended downstream first, resumed upstream first, positions kept.
    suspend = fibers_pipeline(stack_info, "suspend", unique, "-n", namespace)
    assert suspend.returncode == 0, suspend.stdout + suspend.stderr
    order = [line.split()[0].rstrip(":") for line in suspend.stdout.splitlines()[:3]]
    assert order == [f"DatabusConsumer/{view}", f"Transform/{report}", f"Connect/{src}"]
    for kind, name in ((connects, src), (consumers, view), (transforms, report)):
        kind.wait_condition(name, "True", "Suspended", timeout=60)
    assert consumers.status(view)["readyInstances"] == 0 and connects.status(src)["connectorState"] == "STOPPED"
    consumed = consumers.status(view).get("windowScn")
    with source.open("a") as more:
        more.write("".join(f"line {i}\n" for i in range(6, 10)))  # written while everything is suspended
    time.sleep(5)
    assert consumers.status(view).get("windowScn") == consumed  # nothing moved
    resume = fibers_pipeline(stack_info, "resume", unique, "-n", namespace)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert [line.split()[0].rstrip(":") for line in resume.stdout.splitlines()[:3]] == list(reversed(order))
    connects.wait_condition(src, "True", "Running", timeout=60)
    wait_for(
        lambda: (
            {json.loads(v)["id"] for v in read_all(stack_info.kafka_bootstrap, unique)}
            >= {f"line {i}" for i in range(10)}
        ),
        timeout=90,
        what="the lines written while suspended, sent on resume",
    )
    consumers.wait_status(
        view,
        lambda s: s.get("lag") == 0 and s.get("eventsProcessed", 0) >= 4 and s.get("windowScn") != consumed,
        timeout=180,
        what="the consumer caught up from where it stopped",
    )


def test_a_missing_reference_is_a_condition_and_nothing_runs(
    consumers: Resources, transforms: Resources, kube: ApiClient, namespace: str, unique: str
) -> None:
    consumers.create(unique, {"sourceRefs": [{"connectRef": {"name": f"{unique}-nope"}}], "sink": {"type": "log"}})
    ready = consumers.wait_condition(unique, "False", "SourcesNotResolved")
    upstream = consumers.condition(unique, "UpstreamReady")
    expected = f"Connect {unique}-nope (spec.sourceRefs[0].connectRef) does not exist in namespace {namespace}"
    assert (upstream["status"], upstream["reason"], upstream["message"]) == ("False", "UpstreamMissing", expected)
    assert expected in ready["message"]
    instances = client.AppsV1Api(kube).list_namespaced_stateful_set(
        namespace, label_selector=f"fibers.dev/databusconsumer={unique}"
    )
    assert instances.items == []

    transforms.create(
        f"{unique}-t",
        {
            "inputs": [{"name": "rows", "transformRef": {"name": f"{unique}-gone"}}],
            "sql": "SELECT * FROM rows",
            "output": {"files": {"path": "/data/out", "format": "json"}},
        },
    )
    transforms.wait_condition(f"{unique}-t", "False", "InputsNotReady")
    assert transforms.condition(f"{unique}-t", "UpstreamReady")["reason"] == "UpstreamMissing"


def test_a_cycle_of_transform_refs_is_refused(transforms: Resources, unique: str) -> None:
    def reads(other: str) -> dict[str, Any]:
        return {
            "inputs": [{"name": "rows", "transformRef": {"name": other}}],
            "sql": "SELECT * FROM rows",
            "output": {"kafka": {"topic": f"{other}-out"}},
        }

    transforms.create(f"{unique}-a", reads(f"{unique}-b"))
    transforms.create(f"{unique}-b", reads(f"{unique}-a"))
    for name, other in ((f"{unique}-a", f"{unique}-b"), (f"{unique}-b", f"{unique}-a")):
        cond = transforms.wait_condition(name, "False", "InvalidSpec")
        assert f"transformRef makes a cycle ({name} → {other} → {name})" in cond["message"]
        assert transforms.condition(name, "Stalled")["status"] == "True"
        assert "currentRun" not in transforms.status(name), "nothing was submitted"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"sink": {"type": "log"}}, "sources, or the resources that write them in sourceRefs"),
        (
            {"sourceRefs": [{"connectRef": {"name": "a"}, "transformRef": {"name": "b"}}], "sink": {"type": "log"}},
            "exactly one of connectRef, transformRef",
        ),
        (
            {"sourceRefs": [{"connectRef": {"name": "Not_A_Name"}}], "sink": {"type": "log"}},
            "sourceRefs[0].connectRef.name",
        ),
    ],
)
def test_bad_references_are_refused_by_the_api_server(
    consumers: Resources, unique: str, spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(ApiException) as refused:
        consumers.create(unique, spec)
    assert refused.value.status == 422 and words in str(refused.value.body)


def test_what_the_checkpoints_are_kept_for_cannot_change(consumers: Resources, unique: str) -> None:
    """The sources, and the ConfigMap the checkpoints are in: a consumer given another name for it found no
    checkpoint and started over from startFrom (at `latest`, every record since its last checkpoint skipped)."""
    spec = {"sourceRefs": [{"connectRef": {"name": "a"}}], "sink": {"type": "log"}, "state": "stopped"}
    consumers.create(unique, spec)
    with pytest.raises(ApiException) as refused:
        consumers.patch(unique, {"spec": {"sourceRefs": [{"connectRef": {"name": "b"}}]}})
    assert refused.value.status == 422 and "sourceRefs cannot be changed" in str(refused.value.body)
    with pytest.raises(ApiException) as refused:
        consumers.patch(unique, {"spec": {"checkpoint": {"configMapName": f"{unique}-elsewhere"}}})
    assert refused.value.status == 422 and "checkpoint.configMapName cannot be changed" in str(refused.value.body)
    consumers.patch(unique, {"spec": {"checkpoint": {"minIntervalSeconds": 2}}})  # the rest of checkpoint may
    wait_for(lambda: consumers.status(unique).get("phase"), timeout=30, what="a status")


# ----- Replay: a pipeline moved back to a time ------------------------------------------------------------


def fibers_replay(stack_info: StackInfo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fibers", "replay", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KUBECONFIG": stack_info.kubeconfig},
    )


def test_a_pipeline_replayed_from_a_time_recomputes_and_puts_its_view_right_from_there(
    transforms: Resources,
    consumers: Resources,
    mongo: Any,
    mongo_secret: str,
    namespace: str,
    stack_info: StackInfo,
    unique: str,
) -> None:
    """A Transform and a DatabusConsumer reading one topic, records on both sides of T. The view is then
    "corrupted" (a callback's bug, a hand edit): `fibers replay` from T with sinks reapply runs the Transform
    again over the records since T and puts right the documents those records wrote, in order, and says so
    step by step; the document last written before T is left as it was (the replay starts at T). More
    documents are put right than FerretDB's sink replaces one by one (mongo_servers.FEW_REPLACES)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from fibers.startfrom import format_time

    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    t = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    since_t = FEW_REPLACES + 4
    for i, stamp in enumerate([t - 30_000 + i for i in range(4)] + [t + 1_000 * i for i in range(since_t)]):
        producer.produce(unique, key=str(i).encode(), value=json.dumps({"id": i, "v": i}).encode(), timestamp=stamp)
    assert producer.flush(30) == 0
    labels = {"fibers.dev/pipeline": unique}
    transforms.create(
        f"{unique}-agg",
        {
            "inputs": [{"name": "rows", "kafka": {"topics": [unique], "schema": "id INT, v INT"}}],
            "sql": "SELECT id, v FROM rows",
            "output": {"kafka": {"topic": f"{unique}-out"}},
        },
        labels=labels,
    )
    sink = {
        "type": "mongodb",
        "uriSecretRef": {"name": mongo_secret, "key": "uri"},
        "database": unique,
        "collection": "view",
    }
    # A seek of its own from before (the older form, `to`): the Replay's replaces it whole.
    earlier = {"nonce": "by-hand", "to": "earliest"}
    consumers.create(f"{unique}-view", {"sources": [unique], "sink": sink, "seek": earlier}, labels=labels)
    transforms.wait_condition(f"{unique}-agg", "True", "Succeeded", timeout=300)
    consumers.wait_status(f"{unique}-view", lambda s: s.get("windowScn") == 3 + since_t, timeout=180, what="the view")
    view = mongo[unique]["view"]
    view.update_many({}, {"$set": {"v": -1}})  # every document wrong, its SCN kept

    done = fibers_replay(stack_info, unique, "--from", format_time(t), "-n", namespace, "--sinks", "reapply")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (  # each counts the records since T it reads again
        f"Transform/{unique}-agg: Repositioned ({since_t} records)" in done.stdout
        and f"DatabusConsumer/{unique}-view: Repositioned ({since_t} records)" in done.stdout
    ), done.stdout
    assert done.stdout.index("Transform/") < done.stdout.index("DatabusConsumer/")  # the order data flows
    assert transforms.status(f"{unique}-agg")["currentRun"]["recordsOut"] == since_t  # re-computed from T

    def view_right_from_t() -> bool:
        return {d["_id"]: d["v"] for d in view.find()} == {str(i): (i if i >= 4 else -1) for i in range(4 + since_t)}

    wait_for(view_right_from_t, timeout=120, what="the documents written since T put right")


@pytest.fixture
def replays(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "replays", namespace)


def test_a_replay_that_cannot_run_says_why_at_once_and_moves_nothing(replays: Resources, unique: str) -> None:
    replays.create(f"{unique}-later", {"pipeline": unique, "startFrom": {"timestamp": "2999-01-01T00:00:00Z"}})
    cond = replays.wait_condition(f"{unique}-later", "False", "InvalidSpec", timeout=60)
    assert "spec.startFrom.timestamp 2999-01-01T00:00:00.000Z is in the future" in cond["message"]
    replays.create(f"{unique}-none", {"pipeline": f"{unique}-none", "startFrom": {"position": "earliest"}})
    cond = replays.wait_condition(f"{unique}-none", "False", "NothingToReplay", timeout=60)
    assert f"pipeline {unique}-none: no resource to replay" in cond["message"]
    assert replays.status(f"{unique}-none")["phase"] == "Failed"
