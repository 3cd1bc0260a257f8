"""How a challenge ends: a reveal checked in time, a late answer, or none at all.

The reveal is read in one transaction, checked outside any (NumPy, in a thread: the
database is never held while the coordinator computes) and decided in a second one,
guarded by the status it was read in. Its deadline counts to when it arrived, so the
check's own time is never the node's.
"""

import asyncio
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.orm import ChallengeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.trust import challenge_checks, verification
from gpu_share.protocol.trust import (
    ChallengeKind,
    ChallengeParams,
    ChallengeReveal,
    ChallengeStatus,
    ChallengeVerdict,
)

OPEN = (ChallengeStatus.ISSUED, ChallengeStatus.STARTED, ChallengeStatus.COMMITTED)


def params_of(row: ChallengeRow) -> ChallengeParams:
    return ChallengeParams.model_validate(row.params)


def deadline(at: datetime | None, params: ChallengeParams) -> datetime:
    assert at is not None
    return at + timedelta(seconds=params.deadline_sec)


def seconds(since: datetime | None, until: datetime) -> str:
    assert since is not None
    return f"{(until - since).total_seconds():.1f} s"


def _rate(row: ChallengeRow, params: ChallengeParams) -> tuple[float, str]:
    """The chain's FLOPs over the time from the start to the commit, as the coordinator
    saw them: the round trip and the setting up count against the node."""
    assert row.started_at is not None and row.committed_at is not None
    elapsed = max((row.committed_at - row.started_at).total_seconds(), 1e-3)
    flops = challenge_checks.shape_of(params).flops
    if params.kind is ChallengeKind.CPU:
        return flops / elapsed / 1e9, "GFLOP/s"
    return flops / elapsed / 1e12, "TFLOP/s"


def verdict_of(row: ChallengeRow) -> ChallengeVerdict | None:
    if not ChallengeStatus(row.status).final:
        return None
    stored = row.verdict or {}
    return ChallengeVerdict(
        id=row.id,
        status=ChallengeStatus(row.status),
        reason=stored.get("reason"),
        rate=stored.get("rate"),
        rate_unit=stored.get("rate_unit"),
        finished_at=row.finished_at,
    )


async def decide(
    session: AsyncSession,
    row: ChallengeRow,
    status: ChallengeStatus,
    now: datetime,
    settings: Settings,
    reason: str | None = None,
) -> ChallengeVerdict | None:
    """Close an open challenge, once (guarded by the status it was read in), and apply
    what it proved to its node; None when another actor closed it first."""
    stored: dict[str, Any] = {"reason": reason}
    rate = None
    if row.committed_at is not None:
        rate, stored["rate_unit"] = _rate(row, params_of(row))
        stored["rate"] = verification.significant(rate)
    done = await session.execute(
        update(ChallengeRow)
        .where(ChallengeRow.id == row.id, ChallengeRow.status == row.status)
        .values(status=status.value, finished_at=now, verdict=stored)
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        return None
    for name, value in (("status", status.value), ("finished_at", now), ("verdict", stored)):
        set_committed_value(row, name, value)  # as written: nothing left to flush
    node = await session.get(NodeRow, row.node_id, with_for_update=True)
    if node is not None:
        if status is ChallengeStatus.PASSED and rate is not None:
            verification.record_pass(node, row, now, rate, settings)
        else:
            verification.record_failure(node, row)
    return verdict_of(row)


async def reveal(
    db: Database,
    node_id: str,
    challenge_id: str,
    body: ChallengeReveal,
    now: datetime,
    settings: Settings,
) -> ChallengeVerdict:
    """Check the revealed chunks and decide; a repeated reveal gets the verdict again."""
    async with db.read() as session:
        row = await session.get(ChallengeRow, challenge_id)
        if row is None or row.node_id != node_id:
            raise NotFound(f"challenge {challenge_id} does not exist")
    if (decided := verdict_of(row)) is not None:
        return decided
    if row.status != ChallengeStatus.COMMITTED:
        raise Conflict(f"challenge {row.id} is {row.status}: commit its sketches first")
    params = params_of(row)
    reason: str | None
    if now > deadline(row.committed_at, params):
        reason = f"revealed {seconds(row.committed_at, now)} after the commit; the deadline is "
        reason += f"{params.deadline_sec:g} s"
    else:
        asked = challenge_checks.asked_from(row.samples or {})
        reason = await asyncio.to_thread(challenge_checks.check, row.seed, params, asked, body)
    status = ChallengeStatus.PASSED if reason is None else ChallengeStatus.FAILED
    async with db.write() as session:
        current = await session.get(ChallengeRow, challenge_id)
        assert current is not None  # challenges are deleted only with their node
        verdict = None
        if current.status == ChallengeStatus.COMMITTED:
            verdict = await decide(session, current, status, now, settings, reason)
        if verdict is None:  # the expiry loop, or a repeated reveal, decided first
            await session.refresh(current)
            verdict = verdict_of(current)
    if verdict is None:
        raise Conflict(f"challenge {challenge_id} is {current.status}")
    return verdict


async def expire_overdue(session: AsyncSession, now: datetime, settings: Settings) -> int:
    """End the challenges whose node let a deadline pass; each counts as a failure."""
    rows = (await session.scalars(select(ChallengeRow).where(ChallengeRow.status.in_(OPEN)))).all()
    ended = 0
    for row in rows:
        reason = _overdue(row, now, settings)
        if reason and await decide(session, row, ChallengeStatus.EXPIRED, now, settings, reason):
            ended += 1
    return ended


def _overdue(row: ChallengeRow, now: datetime, settings: Settings) -> str | None:
    params = params_of(row)
    if row.status == ChallengeStatus.ISSUED:
        waited = timedelta(seconds=settings.challenge_start_within_sec)
        if now > row.issued_at + waited:
            return f"not started within {settings.challenge_start_within_sec:g} s of its issue"
    elif row.status == ChallengeStatus.STARTED:
        if now > deadline(row.started_at, params):
            return f"no sketches within {params.deadline_sec:g} s of the start"
    elif now > deadline(row.committed_at, params):
        return f"no reveal within {params.deadline_sec:g} s of the commit"
    return None
