import asyncio
import logging
from datetime import datetime

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.platform.overview import nodes_online
from gpu_share.protocol.health import Health

log = logging.getLogger(__name__)


async def count_online_nodes(db: Database, now: datetime, settings: Settings) -> int:
    """Online capacity, as the admin's overview counts it: quarantined nodes are not."""
    async with db.read() as session:
        return await nodes_online(session, now, settings)


async def check(db: Database, now: datetime, version: str, settings: Settings) -> Health:
    if not await db.ping():
        return Health(status="degraded", version=version, database="unreachable", nodes_online=0)
    try:
        async with asyncio.timeout(3):
            nodes_online = await count_online_nodes(db, now, settings)
    except Exception:
        log.warning("health: counting online nodes failed", exc_info=True)
        return Health(status="degraded", version=version, database="unreachable", nodes_online=0)
    return Health(status="ok", version=version, database="ok", nodes_online=nodes_online)
