"""Where another process holds a session, remembered, so a forward relayed there skips
two database reads (the session's row and its node's channel).

A session never moves: it lives on the channel it was opened on, and ends with it. So a
remembered route is never wrong about where the session was; if the session has ended
since, its holder answers that, and if the holder died, the relay fails and says so.
Entries name the tenant the row was read for: another tenant's forward reads the row.
"""

from dataclasses import dataclass

from gpu_share.coordinator.replica.ttl_cache import TtlCache

ROUTE_TTL_SEC = 60.0


@dataclass(frozen=True)
class Route:
    tenant_id: str
    relay_url: str


class SessionRoutes(TtlCache[str, Route]):
    """Routes by session id."""
