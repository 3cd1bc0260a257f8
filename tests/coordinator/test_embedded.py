"""`gpu-share up`'s credentials on disk (coordinator/embedded.py): the enrollment token its
local agent registers with expires like any other, so a later start replaces it."""

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gpu_share.coordinator import embedded
from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import EnrollmentTokenRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock


async def test_a_later_start_replaces_the_local_agents_expired_token_for_the_same_provider(
    settings: Settings,
) -> None:
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    first = await embedded.prepare(settings, clock)
    assert (await embedded.prepare(settings, clock)) == first  # still good: kept

    clock.advance(timedelta(days=settings.enrollment_token_days).total_seconds())
    later = await embedded.prepare(settings, clock)
    assert later.enrollment_token != first.enrollment_token
    assert (later.admin_key, later.tenant_key) == (first.admin_key, first.tenant_key)
    on_disk = json.loads(embedded.credentials_path(settings).read_text())
    assert on_disk["enrollment_token"] == later.enrollment_token

    db = Database(settings.database_url)
    try:
        async with db.read() as session:
            rows = {
                row.token_hash: row
                for row in (await session.scalars(select(EnrollmentTokenRow))).all()
            }
    finally:
        await db.dispose()
    old, new = (
        rows[keys.hash_key(first.enrollment_token)],
        rows[keys.hash_key(later.enrollment_token)],
    )
    assert new.provider_id == old.provider_id  # the same local provider, its node kept
    assert new.expires_at is not None and new.expires_at > clock.now()
