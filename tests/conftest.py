"""Session fixtures: the real local stack, brought up once per test run.

FIBERS_STACK_REUSE=1 reuses a running stack (`fibers-stack up`) and leaves it running afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from kubernetes import config
from kubernetes.client import ApiClient
from pymongo import MongoClient

import fibers_stack as stack
from fibers_stack import StackInfo, demo_pause
from fibers_stack import crds as fibers_crds


@pytest.fixture(scope="session")
def stack_info(request: pytest.FixtureRequest) -> Iterator[StackInfo]:
    reuse = os.environ.get("FIBERS_STACK_REUSE") == "1"
    before = stack.current()
    was_running = bool(before and before.pids and not before.dead())
    info = stack.up()
    saved = dict(os.environ)
    os.environ.update(info.env())
    api = config.new_client_from_config(config_file=info.kubeconfig)
    suspended = demo_pause.suspend(api)
    if suspended:  # past pytest's capture (it holds file descriptor 2 too): why the demo went quiet
        names = ", ".join(f"{plural}/{name}" for plural, name, _ in suspended)
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\nthe demo's pipeline (namespace shop) is suspended while the tests run: {names}", flush=True)
    yield info
    try:
        demo_pause.resume(api, suspended)
    finally:
        api.close()
    os.environ.clear()
    os.environ.update(saved)
    if not (reuse or was_running):
        stack.down()
        # Nothing of the node may outlive it: processes, mounts, links, iptables chains, cgroups.
        assert stack.leftovers() == [], f"`stack down` left these behind: {stack.leftovers()}"


@pytest.fixture
def unique() -> str:
    """A short name no other test (or earlier run against a reused stack) has used."""
    return "t" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def kube(stack_info: StackInfo) -> Iterator[ApiClient]:
    client = config.new_client_from_config(config_file=stack_info.kubeconfig)
    yield client
    client.close()


@pytest.fixture(scope="session")
def crds(kube: ApiClient) -> None:
    """Install (or update) every CRD in crds/ and wait until each is served."""
    fibers_crds.apply(kube)


@pytest.fixture(scope="session")
def connect_http(stack_info: StackInfo) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack_info.connect_url, timeout=30) as client:
        yield client


@pytest.fixture
def pg(stack_info: StackInfo) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def mongo(stack_info: StackInfo) -> Iterator[MongoClient[dict[str, object]]]:
    client: MongoClient[dict[str, object]] = MongoClient(stack_info.mongodb_uri, serverSelectionTimeoutMS=10000)
    yield client
    client.close()
