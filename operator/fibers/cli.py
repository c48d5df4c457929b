"""The `fibers` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from importlib import metadata
from typing import TYPE_CHECKING, Any

from fibers import logs
from fibers.redact import redact

if TYPE_CHECKING:
    from fibers.databus.config import ConsumerConfig
    from fibers.kubeapi import Api


def _run(args: argparse.Namespace) -> int:
    import kopf

    from fibers import (
        controller,  # registers the handlers
        memory,
        metrics,
        settings,
    )
    from fibers.readiness import Readiness

    memory.limit_arenas()

    if args.connect_cluster:
        os.environ["FIBERS_CONNECT_DEFAULT_CLUSTER"] = args.connect_cluster
    os.environ[settings.NAMESPACES_ENV] = ",".join(args.namespace or [])  # the child watches' scope
    readiness = Readiness()
    if args.metrics_port:
        checks = {"/readyz": readiness.waiting, "/readyz/standby": readiness.waiting_to_take_over}
        metrics.serve(args.metrics_port, kinds=controller.RECONCILED_KINDS, checks=checks)
    peering: dict[str, Any] = (
        {"standalone": False, "peering_name": args.peering, "priority": args.priority}
        if args.peering
        else {"standalone": True}
    )
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(readiness=readiness),
        **peering,
    )
    return 0


def _consume(args: argparse.Namespace) -> int:
    from fibers import termination
    from fibers.consumer import tuning
    from fibers.consumer.ownership import Members
    from fibers.consumer.runtime import Runtime
    from fibers.consumer.stops import FOR_GOOD_EXITS
    from fibers.databus.config import POD_NAME_ENV, POD_UID_ENV, ConsumerConfig
    from fibers.kubeapi import Api

    raw = args.config or os.environ.get("FIBERS_CONSUMER_CONFIG", "")
    try:
        data = json.loads(raw)
        if args.instance is not None:
            data["instance"] = args.instance
        config = ConsumerConfig.from_dict(data).check()
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        message = f"invalid configuration: {type(exc).__name__}: {exc}"
        logging.getLogger("fibers.consumer").error(message)
        termination.write(message)
        return 2
    pod, uid = os.environ.get(POD_NAME_ENV), os.environ.get(POD_UID_ENV, "")  # in the StatefulSet's pods
    try:
        api = Api()
    except Exception as exc:  # no credentials at all: nothing to report the stop on
        termination.write(f"{type(exc).__name__}: {exc}", config.secrets())
        return _crashed(exc, config.secrets())
    try:
        members = Members.of_pod(api, config.namespace, config.name, pod, uid) if pod else None
        runtime = Runtime(config, api, members=members, telemetry=bool(args.metrics_port))
        if runtime.telemetry:
            runtime.telemetry.serve(args.metrics_port)
    except Exception as exc:  # the sink or callback could not be set up (a class that does not import, …)
        termination.write(f"{type(exc).__name__}: {exc}", config.secrets())
        code = _crashed(exc, config.secrets())
        # A class that does not import or take its options fails the same way after a restart; anything else
        # (a DNS look-up, a port in use) may not.
        return _halted(api, config, pod, code) if isinstance(exc, SETUP_FOR_GOOD) else code
    tuning.settle_collector()
    try:
        code = runtime.run()
    except Exception as exc:  # run() has written the termination message and the FAIL lineage event
        code = _crashed(exc, config.secrets())
    else:
        code = _halted(api, config, pod, code) if code in FOR_GOOD_EXITS else code
    if runtime.sinks.driver.abandoned_threads:
        # A callback thread given up on may still be stuck in a server's call, and Python joins a pool's threads
        # at exit: the process would outlive its stop (to the kubelet's SIGKILL). The runtime has shut down.
        logging.shutdown()
        os._exit(code)
    return code


SETUP_FOR_GOOD = (ImportError, AttributeError, TypeError, ValueError)


def _halted(api: Api, config: ConsumerConfig, pod: str | None, code: int) -> int:
    """In a pod, a consumer stopped by what no restart can change (a record it may not pass, a callback
    that does not load, a relay that no longer holds its next record and no bootstrap store) says why on
    its checkpoint ConfigMap (the operator puts it on the resource's condition) and waits to be replaced,
    instead of exiting into the same failure again: a crash loop. A spec change, a seek or a restart nonce
    replaces the pod. Other stops exit: a restart is their retry (a sink down longer than the retries, a
    relay that dropped what it was reading). Outside a pod (tests, benchmarks) it exits with `code` at once."""
    if not pod:
        return code
    from fibers import termination
    from fibers.consumer.checkpoint_store import CheckpointStore
    from fibers.consumer.ownership import ordinal_of

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    ordinal = ordinal_of(pod)
    store = CheckpointStore(
        api, config.namespace, config.checkpoint_config_map, config.topics, instance=ordinal, labels=config.labels
    )
    store.stopping = stopped.is_set
    try:
        store.record_stop(termination.last or f"exited with code {code}")
    except Exception as exc:  # the API server never answered: exiting is all that is left
        logging.getLogger("fibers.consumer").error("could not record the stop", extra={"error": str(exc)})
        return code
    logging.getLogger("fibers.consumer").error("stopped; waiting to be replaced (the resource's condition says why)")
    stopped.wait()
    return code


def _pipeline(args: argparse.Namespace) -> int:
    """Print a pipeline's chain upstream first; exit 1 when a step is not Ready (for scripts), 2 when it is empty.
    With --watch, print it again every --interval seconds until interrupted (the exit code is the last look's)."""
    from fibers import pipeline
    from fibers.kubeconfig import Kubeconfig

    kube = Kubeconfig(args.context)
    namespace = None if args.all_namespaces else args.namespace or kube.namespace
    if args.pipeline:  # fibers pipeline suspend|resume NAME
        try:
            return _suspend_or_resume(kube, args.name, args.pipeline, args.namespace or kube.namespace)
        finally:
            kube.close()
    try:
        while True:
            chains = {ns: pipeline.order(bodies) for ns, bodies in pipeline.fetch(kube, args.name, namespace).items()}
            if args.output == "json":
                looks = [pipeline.as_json(ns, args.name, steps) for ns, steps in chains.items()]
                print(json.dumps(looks if args.all_namespaces else looks[0], indent=2), flush=True)
            else:
                text = "\n\n".join(pipeline.render(f"{ns}/{args.name}", steps) for ns, steps in chains.items())
                print(text or f"no namespace has a pipeline {args.name}", flush=True)
            code = _pipeline_code(list(chains.values()))
            if not args.watch:
                return code
            time.sleep(args.interval)
            print(flush=True)
    except KeyboardInterrupt:
        return 0
    finally:
        kube.close()


def _suspend_or_resume(kube: Any, action: str, name: str, namespace: str) -> int:
    """Set `suspended` (or `running`) on every step of a pipeline: downstream first on suspend, so no step
    reads what an upstream one still writes; upstream first on resume. Each keeps its position."""
    from fibers import pipeline

    if action not in ("suspend", "resume"):
        print(f"fibers pipeline {action} {name}: say suspend or resume, or just the pipeline's name", file=sys.stderr)
        return 2
    steps = pipeline.order(pipeline.fetch(kube, name, namespace).get(namespace) or {})
    if not steps:
        print(f"no pipeline {name} in namespace {namespace}", file=sys.stderr)
        return 2
    state = "suspended" if action == "suspend" else "running"
    for step in reversed(steps) if action == "suspend" else steps:
        kube.patch_object(
            pipeline.KINDS[step.kind], namespace, step.body["metadata"]["name"], {"spec": {"state": state}}
        )
        print(f"  {step.key}: {state}", flush=True)
    print(f"{namespace}/{name}: {len(steps)} steps {state}; `fibers pipeline {name}` shows them")
    return 0


def _replay(args: argparse.Namespace) -> int:
    """Create a Replay of a pipeline from a time (or position) and follow it to its end, a line per change;
    exit 0 when every step was repositioned, 1 when one failed (the line says which, and where it stopped)."""
    from fibers import api as names
    from fibers.kubeconfig import Kubeconfig
    from fibers.startfrom import StartFrom, StartFromError, parse_time

    try:
        positional = args.from_ in ("earliest", "latest")
        start = (
            StartFrom(position=args.from_) if positional else StartFrom(timestamp_ms=parse_time(args.from_, "--from"))
        )
    except StartFromError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    kube = Kubeconfig(args.context)
    namespace = args.namespace or kube.namespace
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "Replay",
        "metadata": {"generateName": f"{args.pipeline[:40]}-"},
        "spec": {"pipeline": args.pipeline, "startFrom": start.to_dict(), "sinks": args.sinks, "sources": args.sources},
    }
    try:
        name = kube.create_object("replays", namespace, body)["metadata"]["name"]
        print(f"replay {namespace}/{name}: pipeline {args.pipeline} {start.describe()}", flush=True)
        said: set[str] = set()
        while True:
            status = kube.get_object("replays", namespace, name).get("status") or {}
            for step in status.get("steps") or []:
                records = f" ({step['records']} records)" if "records" in step else ""
                line = f"  {step['kind']}/{step['name']}: {step['state']}{records}" + (
                    f" — {step['message']}" if step.get("message") else ""
                )
                if line not in said and step["state"] != "Waiting":
                    said.add(line)
                    print(line, flush=True)
            if status.get("phase") in ("Succeeded", "Failed"):
                ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
                print(f"{status['phase']}: {ready.get('message', '')}", flush=True)
                return 0 if status["phase"] == "Succeeded" else 1
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print(f"stopped following; the replay goes on: kubectl get replay {name} -n {namespace}", file=sys.stderr)
        return 130
    finally:
        kube.close()


def _pipeline_code(chains: list[list[Any]]) -> int:
    from fibers import pipeline

    if not any(chains):
        return 2
    return 0 if all(steps and pipeline.first_broken(steps) is None for steps in chains) else 1


def _crds(args: argparse.Namespace) -> int:
    """Apply this version's CRDs (what the chart's pre-upgrade hook runs); exit 1 naming what failed."""
    from fibers import crdsync, kubeapi

    try:
        names = crdsync.apply(kubeapi.Api(), crdsync.bundled())
    except (kubeapi.ApiError, kubeapi.Unreachable, TimeoutError) as exc:
        logging.getLogger("fibers.crds").error("the CRDs were not applied", extra={"error": str(exc)})
        return 1
    logging.getLogger("fibers.crds").info("every CRD is at this version", extra={"crds": names})
    return 0


def _release(args: argparse.Namespace) -> int:
    """Take the operator's finalizers off its resources (what the chart's post-delete hook runs)."""
    from fibers import kubeapi, release

    log = logging.getLogger("fibers.release")
    api, settings = kubeapi.Api(), release.ReleaseSettings()
    try:
        if args.operator:
            namespace, deployment = args.operator.split("/", 1)
            if release.operator_installed(api, namespace, deployment):
                log.info("the operator is still installed: nothing released", extra={"operator": args.operator})
                return 0
            release.wait_for_operator_gone(api, namespace, args.pods, settings)
        done = release.release(api, args.namespace or [], settings)
    except (kubeapi.ApiError, kubeapi.Unreachable, TimeoutError, RuntimeError) as exc:
        log.error("the resources were not released", extra={"error": str(exc)})
        return 1
    if done.deleting:
        log.warning("released while being deleted: what they made is left in place", extra={"resources": done.deleting})
    log.info("every resource released", extra={"count": len(done.resources)})
    return 0


def _crashed(exc: BaseException, secrets: list[str]) -> int:
    """Exit 1 with the traceback Python would print, the secret values (URIs in pymongo's errors) masked."""
    sys.stderr.write(redact("".join(traceback.format_exception(exc)), secrets))
    return 1


def _version() -> str:
    try:
        return metadata.version("fibers")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _program() -> str:
    """`kubectl fibers …` runs the kubectl-fibers script (a kubectl plugin): help and errors say so."""
    return "kubectl fibers" if os.path.basename(sys.argv[0]) == "kubectl-fibers" else "fibers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_program(), description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run_cmd = sub.add_parser("run", help="run the operator")
    run_cmd.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    run_cmd.add_argument("--connect-cluster", help="the ConnectCluster of Connect resources without spec.cluster")
    run_cmd.add_argument("--liveness", help="serve a liveness probe here, e.g. http://0.0.0.0:8080/healthz")
    run_cmd.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    run_cmd.add_argument("--peering", help="kopf peering name: run with standbys (needs kopf's peering CRDs)")
    run_cmd.add_argument("--priority", type=int, default=0, help="peering priority; the highest runs")
    run_cmd.set_defaults(func=_run)

    consume_cmd = sub.add_parser("consume", help="run a DatabusConsumer instance (what its pods run)")
    consume_cmd.add_argument("--config", help="rendered consumer configuration (JSON); default $FIBERS_CONSUMER_CONFIG")
    consume_cmd.add_argument("--instance", type=int, help="this instance's number (overrides the configuration)")
    consume_cmd.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    consume_cmd.set_defaults(func=_consume)

    pipeline_cmd = sub.add_parser("pipeline", help="print a pipeline's steps in order and its first broken link")
    pipeline_cmd.add_argument("name", help="the value of the fibers.dev/pipeline label (or suspend, resume)")
    pipeline_cmd.add_argument(
        "pipeline",
        nargs="?",
        help="after suspend or resume: the pipeline whose steps all become suspended (downstream first) or running",
    )
    pipeline_cmd.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    pipeline_cmd.add_argument("-A", "--all-namespaces", action="store_true", help="that pipeline in every namespace")
    pipeline_cmd.add_argument("--context", help="the kubeconfig context (default: the current one)")
    pipeline_cmd.add_argument("-o", "--output", choices=["text", "json"], default="text")
    pipeline_cmd.add_argument("-w", "--watch", action="store_true", help="print it again every --interval seconds")
    pipeline_cmd.add_argument("--interval", type=float, default=5.0, help="seconds between looks with --watch")
    pipeline_cmd.set_defaults(func=_pipeline)

    replay_cmd = sub.add_parser(
        "replay", help="move a pipeline's steps back to a time, together and in order, and follow it"
    )
    replay_cmd.add_argument("pipeline", help="the value of the fibers.dev/pipeline label")
    replay_cmd.add_argument(
        "--from", dest="from_", required=True, help="an RFC 3339 time (2026-11-27T09:00:00Z), earliest or latest"
    )
    replay_cmd.add_argument("--sinks", choices=["skip-existing", "reapply"], default="skip-existing")
    replay_cmd.add_argument(
        "--sources",
        choices=["keep", "snapshot"],
        default="keep",
        help="snapshot: Debezium sources send their tables again",
    )
    replay_cmd.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    replay_cmd.add_argument("--context", help="the kubeconfig context (default: the current one)")
    replay_cmd.add_argument("--interval", type=float, default=2.0, help="seconds between looks")
    replay_cmd.set_defaults(func=_replay)

    crds_cmd = sub.add_parser("crds", help="apply this version's CRDs (the chart's pre-upgrade hook runs it)")
    crds_cmd.add_argument("action", choices=["apply"])
    crds_cmd.set_defaults(func=_crds)

    release_cmd = sub.add_parser(
        "release", help="take the operator's finalizers off its resources (the chart's post-delete hook runs it)"
    )
    release_cmd.add_argument("-n", "--namespace", action="append", help="only this namespace (repeatable)")
    release_cmd.add_argument(
        "--operator",
        metavar="NAMESPACE/DEPLOYMENT",
        help="release only once this Deployment is gone, and its pods (--pods) with it",
    )
    release_cmd.add_argument("--pods", default="", help="the label selector of the operator's pods")
    release_cmd.set_defaults(func=_release)

    args = parser.parse_args(argv)
    logs.setup(logging.DEBUG if args.verbose else logging.INFO)
    result: int = args.func(args)
    return result
