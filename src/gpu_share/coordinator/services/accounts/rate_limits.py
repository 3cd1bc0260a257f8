"""Fixed-window rate limits per client address, counted in the database so every replica
sees the same count (SPEC §1.8 `RATE_LIMITED`).

A window is `window_sec` long and starts at a multiple of it; a client that passes
`max_hits` in a window is refused until the window ends (`Retry-After`).
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database, upsert
from gpu_share.coordinator.core.errors import RateLimited
from gpu_share.coordinator.core.orm import RateLimitRow
from gpu_share.coordinator.core.settings import Settings

KEEP_WINDOWS_FOR = timedelta(days=1)


@dataclass(frozen=True)
class Limit:
    name: str
    max_hits: int
    window_sec: int
    what: str  # "applications", "failed key lookups": for the message

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        epoch = int(now.timestamp())
        start = epoch - epoch % self.window_sec
        return (
            datetime.fromtimestamp(start, UTC),
            datetime.fromtimestamp(start + self.window_sec, UTC),
        )

    def refusal(self, now: datetime) -> RateLimited:
        _, end = self.window(now)
        retry_after = max(1, int((end - now).total_seconds() + 0.999))
        return RateLimited(
            f"too many {self.what} from this address: at most {self.max_hits} per "
            f"{self.window_sec} s; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
            details={"limit": self.max_hits, "window_sec": self.window_sec},
        )


def applications(settings: Settings) -> Limit:
    return Limit("applications", settings.rate_limit_applications, 3600, "applications")


def failed_keys(settings: Settings) -> Limit:
    return Limit("failed-keys", settings.rate_limit_failed_keys, 60, "failed key lookups")


def _key(limit: Limit, client: str) -> str:
    return f"{limit.name}:{client}"[:200]


async def hit(session: AsyncSession, limit: Limit, client: str, now: datetime) -> int:
    """Count one hit; returns the hits in this window, this one included."""
    start, _ = limit.window(now)
    statement = (
        upsert(session)(RateLimitRow)
        .values(key=_key(limit, client), window_start=start, hits=1)
        .on_conflict_do_update(
            index_elements=[RateLimitRow.key, RateLimitRow.window_start],
            set_={"hits": RateLimitRow.hits + 1},
        )
        .returning(RateLimitRow.hits)
    )
    hits = await session.scalar(statement)
    return int(hits or 0)


async def admit(db: Database, limit: Limit, client: str, now: datetime) -> None:
    """Count this attempt in its own transaction (so a refusal counts too), or refuse it."""
    async with db.write() as session:
        hits = await hit(session, limit, client, now)
    if hits > limit.max_hits:
        raise limit.refusal(now)


async def sweep(session: AsyncSession, now: datetime) -> int:
    done = await session.execute(
        delete(RateLimitRow).where(RateLimitRow.window_start < now - KEEP_WINDOWS_FOR)
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]
