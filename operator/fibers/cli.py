"""The `fibers` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from typing import Any

from fibers import logs


def _stack(args: argparse.Namespace) -> int:
    from fibers import stack
    from fibers.stack import fetch

    if args.action == "fetch":
        fetch.fetch_all(args.components or None)
        return 0
    if args.action == "up":
        info = stack.up()
        print(json.dumps(asdict(info), indent=2))
        print(f"\nexport KUBECONFIG={info.kubeconfig}", file=sys.stderr)
        return 0
    if args.action == "down":
        stack.down()
        return 0
    recorded = stack.current()
    if recorded is None:
        print("no stack recorded")
        return 1
    dead = recorded.dead()
    print(json.dumps({**asdict(recorded), "dead": dead}, indent=2))
    return 1 if dead or not recorded.pids else 0


def _run(args: argparse.Namespace) -> int:
    import kopf

    from fibers import (
        controller,  # noqa: F401  (registers the handlers)
        memory,
        metrics,
    )

    memory.limit_arenas()

    if args.connect_url:
        os.environ["FIBERS_CONNECT_URL"] = args.connect_url
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    peering: dict[str, Any] = (
        {"standalone": False, "peering_name": args.peering, "priority": args.priority}
        if args.peering
        else {"standalone": True}
    )
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        liveness_endpoint=args.liveness or None,
        **peering,
    )
    return 0


def _consume(args: argparse.Namespace) -> int:
    from kubernetes import client

    from fibers.databus.config import ConsumerConfig
    from fibers.databus.runtime import Runtime
    from fibers.kube import load_client

    raw = args.config or os.environ.get("FIBERS_CONSUMER_CONFIG", "")
    config = ConsumerConfig.from_dict(json.loads(raw))
    if args.instance is not None:
        config = ConsumerConfig.from_dict({**json.loads(raw), "instance": args.instance})
    return Runtime(config, client.CoreV1Api(load_client())).run()


def _demo(args: argparse.Namespace) -> int:
    from fibers import demo

    return demo.run(tty=False if args.no_tty else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fibers", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    stack_cmd = sub.add_parser("stack", help="the local stack of real components (tests and demo only)")
    stack_cmd.add_argument("action", choices=["up", "down", "status", "fetch"])
    stack_cmd.add_argument("components", nargs="*", help="fetch: only these (kubernetes, kafka, …)")
    stack_cmd.set_defaults(func=_stack)

    run_cmd = sub.add_parser("run", help="run the operator")
    run_cmd.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    run_cmd.add_argument("--connect-url", help="default Kafka Connect URL for Connect resources without spec.cluster")
    run_cmd.add_argument("--liveness", help="serve a liveness probe here, e.g. http://0.0.0.0:8080/healthz")
    run_cmd.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    run_cmd.add_argument("--peering", help="kopf peering name: run with standbys (needs kopf's peering CRDs)")
    run_cmd.add_argument("--priority", type=int, default=0, help="peering priority; the highest runs")
    run_cmd.set_defaults(func=_run)

    consume_cmd = sub.add_parser("consume", help="run a DatabusConsumer instance (what its pods run)")
    consume_cmd.add_argument("--config", help="rendered consumer configuration (JSON); default $FIBERS_CONSUMER_CONFIG")
    consume_cmd.add_argument("--instance", type=int, help="this instance's number (overrides the configuration)")
    consume_cmd.set_defaults(func=_consume)

    demo_cmd = sub.add_parser("demo", help="run the sample pipeline of examples/ on the local stack")
    demo_cmd.add_argument("--no-tty", action="store_true", help="plain output (no redrawn table)")
    demo_cmd.set_defaults(func=_demo)

    args = parser.parse_args(argv)
    logs.setup(logging.DEBUG if args.verbose else logging.INFO)
    result: int = args.func(args)
    return result
