"""When and how the Connect sync lists a cluster's connectors with their configs, not only their statuses.

Configs are how drift is seen (a config changed by hand is written back) and how a connector's owner is
read. Connect builds them at a cost that grows faster than its connectors (one request per connector in
its herder's queue): at 1,000 a quiet Connect answers in well under a second, but while it starts
thousands of tasks the same listing waited 249-301 s (connect_scale at 5,000, two workers), where a
status-only listing took 63 ms. So a listing with configs is asked at a pace that follows how long the last
one took, and one Connect does not answer in time leaves the sync on statuses for `config_read_retry`
seconds instead of making every resource unreachable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from fibers.connect.policy import ConnectPolicy
from fibers.connect.rest import ConnectClient, ConnectError, ConnectorView, ConnectUnreachable
from fibers.redact import redact

log = logging.getLogger("fibers.connect")


@dataclass
class ConfigReads:
    """Per cluster: when a listing with configs was last answered, how long it took, and whether Connect
    left the last one unanswered. `interval` is `SyncSettings.interval`, the pace at rest."""

    interval: float
    policy: ConnectPolicy
    _asked_at: dict[str, float] = field(default_factory=dict)  # when the last answered one was asked
    _took: dict[str, float] = field(default_factory=dict)  # how long that one took, in seconds
    _unanswered_at: dict[str, float] = field(default_factory=dict)  # when the last unanswered one was asked

    async def listing(
        self,
        client: ConnectClient,
        cluster: str,
        configs: bool,
        *,
        statuses: dict[str, ConnectorView] | None = None,
    ) -> tuple[dict[str, ConnectorView], bool]:
        """The cluster's listing, and whether it carries configs. A listing with configs that Connect does not
        answer is stood in for by one of statuses only, asked as soon as the configs are late
        (`ConnectPolicy.statuses_alongside_configs_after`), or by `statuses`, this sync's: the resources'
        states stay known, their configs are asked again later. A Connect that answers neither is
        unreachable after one timeout (raised from here)."""
        if not configs:
            return await client.list_expanded(configs=False), False
        asked = time.monotonic()
        with_configs = asyncio.ensure_future(client.list_expanded(configs=True))
        fallback: asyncio.Future[dict[str, ConnectorView]] | None = None
        try:
            if statuses is None:
                await asyncio.wait([with_configs], timeout=self.policy.statuses_alongside_configs_after)
                if not with_configs.done():
                    fallback = asyncio.ensure_future(client.list_expanded(configs=False))
            try:
                listing = await with_configs
            except (ConnectUnreachable, ConnectError) as exc:
                if statuses is not None:
                    listing = statuses
                elif fallback is not None and not (fallback.done() and fallback.exception()):
                    listing = await fallback  # under way (a partition: it fails too, one timeout later)
                else:  # asked after, or failed at once (a worker restarting): asked again
                    listing = await client.list_expanded(configs=False)
                self.not_answered(cluster, asked)
                log.warning(
                    "Kafka Connect did not list its connectors' configs; statuses only for now",
                    extra={
                        "cluster": cluster,
                        "error": redact(str(exc), ()),
                        "retry_seconds": self.policy.config_read_retry,
                    },
                )
                return listing, False
        finally:
            for call in (with_configs, fallback):
                if call is not None and not call.done():
                    call.cancel()  # configs answered, or this sync is being cancelled
                elif call is not None and not call.cancelled():
                    call.exception()  # seen: a statuses listing not needed may have failed unheard
        self.answered(cluster, asked, seconds=time.monotonic() - asked)
        return listing, True

    def due(self, cluster: str, now: float, *, quiet: bool) -> bool:
        """Whether this sync's listing should carry configs: the periodic read, once the cluster is `quiet`
        (none of our creates under way, none of our connectors starting), at most every interval, and less
        often the longer the last answer took."""
        spacing = max(self.interval, self.policy.config_read_spacing_factor * self._took.get(cluster, 0.0))
        return quiet and self.may_force(cluster, now) and now - self._asked_at.get(cluster, -spacing) >= spacing

    def may_force(self, cluster: str, now: float) -> bool:
        """Whether configs may be asked at all now: not within `config_read_retry` s of one not answered
        (a resource whose config is not verified waits too; Connect changes nothing meanwhile)."""
        unanswered = self._unanswered_at.get(cluster)
        return unanswered is None or now - unanswered >= self.policy.config_read_retry

    def answered(self, cluster: str, asked_at: float, *, seconds: float) -> None:
        self._asked_at[cluster], self._took[cluster] = asked_at, seconds
        self._unanswered_at.pop(cluster, None)

    def not_answered(self, cluster: str, asked_at: float) -> None:
        self._unanswered_at[cluster] = asked_at

    def forget_answer(self, cluster: str) -> None:
        """As if configs had never been read (a test's "an interval has passed")."""
        self._asked_at.pop(cluster, None)
