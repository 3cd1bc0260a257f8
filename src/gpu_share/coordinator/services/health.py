import asyncio
import logging
from datetime import datetime

from gpu_share.coordinator.db import Database
from gpu_share.protocol.health import Health

log = logging.getLogger(__name__)


async def count_online_nodes(db: Database, now: datetime) -> int:
    return 0


async def check(db: Database, now: datetime, version: str) -> Health:
    if not await db.ping():
        return Health(status="degraded", version=version, database="unreachable", nodes_online=0)
    try:
        async with asyncio.timeout(3):
            nodes_online = await count_online_nodes(db, now)
    except Exception:
        log.warning("health: counting online nodes failed", exc_info=True)
        return Health(status="degraded", version=version, database="unreachable", nodes_online=0)
    return Health(status="ok", version=version, database="ok", nodes_online=nodes_online)
