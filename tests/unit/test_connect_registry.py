"""The ConnectCluster registry builds each cluster's client from its Secrets (credentials, CA)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from fibers.connect.registry import ClusterSettings, ConnectClusters
from fibers.kube import SecretMissing


class Secrets:
    """Stands in for fibers.kube.Kube's Secret reads."""

    def __init__(self, values: dict[tuple[str, str, str], str]) -> None:
        self.values = values

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        if (namespace, name, key) not in self.values:
            raise SecretMissing(f"Secret {namespace}/{name} not found")
        return self.values[namespace, name, key]


def _registered(
    spec: dict[str, Any], secrets: dict[tuple[str, str, str], str], settings: ClusterSettings | None = None
) -> tuple[Any, str, dict[str, str]]:
    async def scenario() -> tuple[Any, str, dict[str, str]]:
        registry = ConnectClusters(Secrets(secrets), settings or ClusterSettings())  # type: ignore[arg-type]
        changed: list[int] = []
        registry.on_change = lambda: changed.append(1)
        await registry.observe("ADDED", {"metadata": {"name": "c", "uid": "u", "generation": 1}, "spec": spec})
        known = registry.known["c"]
        headers = dict(known.client._http.headers) if known.client else {}
        await registry.aclose()
        assert changed == [1]
        return known, known.problem, headers

    return asyncio.run(scenario())


def test_basic_auth_header_from_the_secret() -> None:
    spec = {"url": "http://c:8083", "auth": {"basic": {"secretRef": {"namespace": "ops", "name": "creds"}}}}
    known, problem, headers = _registered(spec, {("ops", "creds", "username"): "u", ("ops", "creds", "password"): "p"})
    assert problem == ""
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
    assert "p" in known.secrets  # masked wherever the cluster's errors are reported


def test_bearer_token_from_the_secret() -> None:
    spec = {"url": "http://c:8083", "auth": {"bearer": {"secretRef": {"namespace": "ops", "name": "tok"}}}}
    _, problem, headers = _registered(spec, {("ops", "tok", "token"): "abc\n"})
    assert (problem, headers["Authorization"]) == ("", "Bearer abc")


def test_missing_secret_is_a_problem_and_no_client() -> None:
    spec = {"url": "http://c:8083", "auth": {"bearer": {"secretRef": {"namespace": "ops", "name": "tok"}}}}
    known, problem, _ = _registered(spec, {})
    assert known.client is None
    assert problem == "Secret ops/tok not found"


def test_no_auth_sends_no_credentials() -> None:
    _, problem, headers = _registered({"url": "http://c:8083"}, {})
    assert problem == "" and "Authorization" not in headers


def test_a_secret_outside_the_credential_namespaces_is_never_read() -> None:
    """Whoever may write a ConnectCluster could otherwise have any namespace's Secret read and sent to a
    URL of their choosing: only the operator's namespace and those the chart lists are read."""
    reads: list[tuple[str, str]] = []

    class Recording(Secrets):
        async def secret_value(self, namespace: str, name: str, key: str) -> str:
            reads.append((namespace, name))
            return await super().secret_value(namespace, name, key)

    values = {("team-b", "db", "username"): "u", ("team-b", "db", "password"): "hunter2"}
    spec = {"url": "http://evil:8083", "auth": {"basic": {"secretRef": {"namespace": "team-b", "name": "db"}}}}
    settings = ClusterSettings(secret_namespaces=frozenset({"fibers-system"}))

    async def scenario() -> Any:
        registry = ConnectClusters(Recording(values), settings)  # type: ignore[arg-type]
        await registry.observe("ADDED", {"metadata": {"name": "c", "uid": "u", "generation": 1}, "spec": spec})
        await registry.aclose()
        return registry.known["c"]

    known = asyncio.run(scenario())
    assert reads == [] and known.client is None
    assert "Secret team-b/db" in known.problem and "fibers-system" in known.problem


def test_a_rotated_secret_gives_the_clusters_naming_it_a_new_client_and_no_other() -> None:
    """Credentials were read once, when the cluster was seen: a rotated password never reached the
    cluster's calls until its spec changed. A Secret's change (the operator's watch) now has the clusters
    naming it read their Secrets again and be probed at once; other clusters keep their clients."""
    values = {("ops", "creds", "username"): "u", ("ops", "creds", "password"): "old"}

    async def scenario() -> tuple[str, str, str, bool, bool]:
        registry = ConnectClusters(Secrets(values), ClusterSettings())  # type: ignore[arg-type]
        auth = {"basic": {"secretRef": {"namespace": "ops", "name": "creds"}}}
        for name, spec in (("c", {"url": "http://c:8083", "auth": auth}), ("d", {"url": "http://d:8083"})):
            await registry.observe("ADDED", {"metadata": {"name": name, "uid": name, "generation": 1}, "spec": spec})
        before, other = registry.known["c"].client, registry.known["d"].client
        assert before is not None and other is not None
        old_header = before._http.headers["Authorization"]
        values["ops", "creds", "password"] = "new"
        await registry.secret_changed("ops", "unrelated")
        await registry.secret_changed("elsewhere", "creds")
        assert registry.known["c"].client is before  # neither names it
        await registry.secret_changed("ops", "creds")
        after = registry.known["c"].client
        assert after is not None
        new_header = after._http.headers["Authorization"]
        due_now = registry.known["c"].due == 0.0
        untouched = registry.known["d"].client is other
        await registry.aclose()
        for task in list(registry._retiring):
            task.cancel()
        return old_header, new_header, registry.known["c"].secrets[0], due_now, untouched

    old_header, new_header, masked, due_now, untouched = asyncio.run(scenario())
    assert old_header == "Basic " + base64.b64encode(b"u:old").decode()
    assert new_header == "Basic " + base64.b64encode(b"u:new").decode()
    assert masked == "new"  # the new value is masked in the cluster's errors
    assert due_now and untouched


class ProbedKube(Secrets):
    """Secrets, and the ConnectCluster status writes."""

    def __init__(self) -> None:
        super().__init__({})
        self.written: list[dict[str, Any]] = []

    async def replace_cluster_status(
        self, plural: str, name: str, status: dict[str, Any], previous: dict[str, Any]
    ) -> None:
        self.written.append(status)


class AnsweringConnect:
    async def server_info(self) -> dict[str, Any]:
        return {"version": "4.1.1", "commit": "abc", "kafka_cluster_id": "k1"}

    async def plugins(self) -> list[dict[str, Any]]:
        return [{"class": "FileStreamSource", "type": "source", "version": "4.1.1"}]

    async def aclose(self) -> None:
        pass


def _probed_twice(stored: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One operator process: the cluster seen (with `stored` as its status), probed, a listing noted, probed."""
    from fibers.connect.rest import ConnectorView

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        kube = ProbedKube()
        registry = ConnectClusters(kube, ClusterSettings())  # type: ignore[arg-type]
        body = {"metadata": {"name": "c", "uid": "u", "generation": 1}, "spec": {"url": "http://c:8083"}}
        await registry.observe("ADDED", {**body, "status": stored})
        known = registry.known["c"]
        known.client = AnsweringConnect()  # type: ignore[assignment]
        await registry._probe(known)
        view = {"status": {"connector": {"state": "RUNNING", "worker_id": "w1:8083"}, "tasks": []}}
        registry.note_listing("c", {"orders": ConnectorView.from_listing("orders", view)})
        await registry._probe(known)
        return kube.written, known.status

    return asyncio.run(scenario())


def test_a_restarted_operator_writes_no_connect_cluster_status_that_has_not_changed() -> None:
    """The workers and connector count come from the Connect sync's listing: the first probe of a new
    process kept them out, and the listing put them back — two writes of an unchanged status per restart."""
    first, status = _probed_twice({})
    assert status["workers"] == ["w1:8083"] and status["connectors"] == 1 and first
    again, _ = _probed_twice(status)
    assert again == []


def test_a_late_deleted_event_of_an_earlier_cluster_does_not_drop_the_one_created_under_its_name() -> None:
    """kopf handles each uid's events apart: a ConnectCluster deleted and created again (Argo CD's replace) may
    have its new one's first event handled before the old one's DELETED. That DELETED must not forget the new
    cluster, or every Connect placed on it would wait for a cluster that is there."""

    async def scenario() -> list[str]:
        registry = ConnectClusters(Secrets({}), ClusterSettings())  # type: ignore[arg-type]
        spec = {"url": "http://c:8083"}
        await registry.observe(None, {"metadata": {"name": "c", "uid": "u1", "generation": 1}, "spec": spec})
        await registry.observe("ADDED", {"metadata": {"name": "c", "uid": "u2", "generation": 1}, "spec": spec})
        await registry.observe("DELETED", {"metadata": {"name": "c", "uid": "u1", "generation": 1}, "spec": spec})
        kept = [known.uid for known in registry.known.values()]
        await registry.observe("DELETED", {"metadata": {"name": "c", "uid": "u2", "generation": 1}, "spec": spec})
        await registry.aclose()
        return kept + list(registry.known)

    assert asyncio.run(scenario()) == ["u2"]
