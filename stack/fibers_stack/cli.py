"""The `fibers-stack` command line: the local stack and the demo (development tooling)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

from fibers import logs

JSON_ENV = "FIBERS_STACK_LOG_JSON"


def _up(args: argparse.Namespace) -> int:
    import fibers_stack as stack

    info = stack.up()
    print(json.dumps(asdict(info), indent=2))
    print(f"\nexport KUBECONFIG={info.kubeconfig}", file=sys.stderr)
    return 0


def _down(args: argparse.Namespace) -> int:
    import fibers_stack as stack

    stack.down()
    return 0


def _status(args: argparse.Namespace) -> int:
    import fibers_stack as stack

    return stack.status()


def _fetch(args: argparse.Namespace) -> int:
    from fibers_stack import fetch

    fetch.fetch_all(args.components or None)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from fibers_stack import demo

    return demo.run(tty=False if args.no_tty else None)


def _user_image(args: argparse.Namespace) -> int:
    import fibers_stack as stack

    info = stack.current()
    if info is None or info.dead():
        print("the stack is not running: fibers-stack up", file=sys.stderr)
        return 1
    context = Path(args.context).resolve()
    print(stack.user_image(info, args.name or f"user-{context.name}", context))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fibers-stack", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start the stack (a real one-node cluster, Kafka, Connect, …) or show the running one")
    sub.add_parser("down", help="stop everything and leave nothing behind (processes, mounts, bridges, chains)")
    sub.add_parser("status", help="the stack's processes, the node and its system pods")
    fetch_cmd = sub.add_parser("fetch", help="build or fetch every component into the cache (Argo CD: when named)")
    fetch_cmd.add_argument("components", nargs="*", help="only these (kubernetes, kafka, images, argocd, …)")
    demo_cmd = sub.add_parser("demo", help="run the sample pipeline of examples/ on the local stack")
    demo_cmd.add_argument("--no-tty", action="store_true", help="plain output (no redrawn table)")
    image_cmd = sub.add_parser(
        "user-image", help="build your image from a Dockerfile FROM the job image, and load it into the node"
    )
    image_cmd.add_argument("context", help="the folder with the Dockerfile (e.g. examples/callback)")
    image_cmd.add_argument("--name", help="image name (default: user-<folder>); prints name:tag")
    handlers = {"up": _up, "down": _down, "status": _status, "fetch": _fetch, "demo": _demo, "user-image": _user_image}
    args = parser.parse_args(argv)
    # A person's tool: lines to read, in a terminal or piped to tee alike (FIBERS_STACK_LOG_JSON=1: JSON).
    logs.setup(logging.DEBUG if args.verbose else logging.INFO, json_lines=os.environ.get(JSON_ENV) == "1")
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
