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


def _images(args: argparse.Namespace) -> int:
    import fibers_stack as stack
    from fibers_stack import images, registry, yamlout

    if args.push:
        destination, cert_dir = args.push, Path(args.cert_dir) if args.cert_dir else None
        ca_files = sorted(cert_dir.glob("*.crt")) if cert_dir else []
        ca_file = ca_files[0] if ca_files else None
    elif (info := stack.current()) is not None and not info.dead():
        reg = info.oci_registry()
        destination, ca_file, cert_dir = reg.host, reg.ca, reg.cert_dir
    else:
        print("name a registry to push to (--push registry.example.com/platform) or start the stack", file=sys.stderr)
        return 1
    operator, job = images.build_fibers()
    pushed = {"image": images.push_to(destination, operator, cert_dir=cert_dir)}
    pushed["jobs"] = images.push_to(destination, job, cert_dir=cert_dir)
    chart, version = registry.push_chart(destination, ca_file)
    values = {key: images.chart_values(ref) for key, ref in pushed.items()}
    text = yamlout.dump({"image": values["image"], "jobs": {"image": values["jobs"]}}, sort_keys=False)
    if args.values:
        Path(args.values).write_text(text)
        print(f"wrote the chart's image values to {args.values}", file=sys.stderr)
    print(
        f"install: helm install fibers {chart} --version {version} -f {args.values or '<these values>'}",
        file=sys.stderr,
    )
    print(text, end="")
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
    images_cmd = sub.add_parser(
        "images", help="build the operator's two images, push them and the chart (default: to the stack's registry)"
    )
    images_cmd.add_argument("--push", metavar="REGISTRY", help="registry[/path] to push to (log in: buildah login)")
    images_cmd.add_argument("--cert-dir", help="a folder with the CA (*.crt) of a registry signed by a private CA")
    images_cmd.add_argument("--values", metavar="FILE", help="also write the chart's image values (by digest) here")
    image_cmd = sub.add_parser(
        "user-image", help="build your image from a Dockerfile FROM the job image, and push it to the stack's registry"
    )
    image_cmd.add_argument("context", help="the folder with the Dockerfile (e.g. examples/callback)")
    image_cmd.add_argument("--name", help="image name (default: user-<folder>); prints its reference by digest")
    handlers = {
        "up": _up,
        "down": _down,
        "status": _status,
        "fetch": _fetch,
        "demo": _demo,
        "images": _images,
        "user-image": _user_image,
    }
    args = parser.parse_args(argv)
    # A person's tool: lines to read, in a terminal or piped to tee alike (FIBERS_STACK_LOG_JSON=1: JSON).
    logs.setup(logging.DEBUG if args.verbose else logging.INFO, json_lines=os.environ.get(JSON_ENV) == "1")
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
