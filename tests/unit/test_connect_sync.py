"""ConnectSync's create path, with the Kubernetes and Connect clients replaced by small recorders.

Connect lists a new connector only once its herder has caught up, so a listing taken right after our
create may still lack it; the sync must not create the connector a second time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fibers.connect.rest import ConnectorView
from fibers.connect.sync import ConnectSync, SyncSettings

CLUSTER = "http://connect:8083"


class RecordingKube:
    """Stands in for fibers.kube.Kube: keeps the last status written per resource."""

    def __init__(self) -> None:
        self.statuses: dict[str, dict[str, Any]] = {}

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], previous: dict[str, Any]
    ) -> None:
        self.statuses[name] = status

    def post_event_soon(self, *args: Any, **kwargs: Any) -> None:
        pass


class LaggingConnect:
    """A Connect whose listing does not show created connectors yet (its herder lags behind)."""

    def __init__(self) -> None:
        self.creates: list[str] = []

    async def list_expanded(self, *, configs: bool = True) -> dict[str, ConnectorView]:
        return {}

    async def create(self, name: str, config: dict[str, str], initial_state: str) -> None:
        self.creates.append(name)


def _body(name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {"cluster": CLUSTER, "class": "FileStreamSource", "config": {"file": "/tmp/in", "topic": "t"}},
    }


def test_a_connector_just_created_is_not_created_again_while_the_listing_lags() -> None:
    async def scenario() -> tuple[list[str], dict[str, Any]]:
        kube, connect = RecordingKube(), LaggingConnect()
        sync = ConnectSync(kube, SyncSettings(fast_interval=0.05))  # type: ignore[arg-type]
        sync.clients[CLUSTER] = connect  # type: ignore[assignment]
        await sync.apply(_body("orders"))  # type: ignore[arg-type]
        targets = list(sync.targets.values())
        for _ in range(3):  # three syncs, none of whose listings shows the new connector
            await sync._sync_cluster(CLUSTER, targets)
            await asyncio.gather(*sync._in_flight.values())
        return connect.creates, kube.statuses["orders"]

    creates, status = asyncio.run(scenario())
    assert creates == ["orders"]
    assert status["connectorName"] == "orders"  # claimed before the create
    assert status["phase"] == "Pending"
