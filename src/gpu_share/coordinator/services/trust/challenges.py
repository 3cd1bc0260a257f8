"""Hardware challenges from issue to verdict (docs/trust.md, "Hardware challenges").

    issued ──start──▶ started ──commit in time──▶ committed ──reveal checks──▶ passed
       │                 │  └─commit late──▶ failed          └─wrong, late──▶ failed
       └── not started in time, no commit, no reveal ──▶ expired

One challenge at a time per node: `issue_due` locks the node row and issues only when
none is open. Deadlines are the coordinator's clock against the times it recorded;
the node's word about time counts for nothing. Every transition of an open challenge
is guarded by its status, so a reveal and the expiry loop cannot both decide one.
"""

import hashlib
import secrets
import struct
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import desc, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.challenge import sizing
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.driver_sql import Row, Sql
from gpu_share.coordinator.core.errors import Conflict, NotFound, field_error
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import ChallengeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.trust import challenge_checks, hardware_claims, verdicts
from gpu_share.coordinator.services.trust.hardware_claims import Claim
from gpu_share.protocol.trust import (
    Challenge,
    ChallengeCommit,
    ChallengeCommitted,
    ChallengeKind,
    ChallengeOrder,
    ChallengeParams,
    ChallengeSample,
    ChallengeStart,
    ChallengeStatus,
    decode,
)

OPEN = verdicts.OPEN
HISTORY_LIMIT = 100


def params_for(claim: Claim, settings: Settings) -> ChallengeParams | None:
    """The challenge for a claim; None when no chain within the bounds fits it."""
    try:
        shape = sizing.size(
            sizing.Kind(claim.kind.value),
            rate_flops=claim.rate_flops,
            memory_bytes=claim.memory_bytes,
            target_sec=settings.challenge_target_sec,
            memory_share=settings.challenge_memory_share,
            samples=settings.challenge_samples,
            scale=settings.challenge_scale,
        )
    except sizing.CannotSize:
        return None
    return ChallengeParams(
        kind=claim.kind,
        width=shape.width,
        rows=shape.rows,
        steps=shape.steps,
        sketch_rows=shape.sketch_rows,
        samples=settings.challenge_samples,
        deadline_sec=settings.challenge_allowance_sec
        + settings.challenge_target_sec / settings.challenge_efficiency_floor,
        target_sec=settings.challenge_target_sec,
    )


async def _recent_failures(
    session: AsyncSession, since: datetime, node_ids: list[str] | None = None
) -> dict[str, set[str]]:
    query = select(ChallengeRow.node_id, ChallengeRow.target).where(
        ChallengeRow.status.in_([ChallengeStatus.FAILED, ChallengeStatus.EXPIRED]),
        ChallengeRow.finished_at >= since,
    )
    if node_ids is not None:
        query = query.where(ChallengeRow.node_id.in_(node_ids))
    failed: dict[str, set[str]] = {}
    for node_id, target in (await session.execute(query)).all():
        failed.setdefault(node_id, set()).add(target)
    return failed


async def nodes_due(session: AsyncSession, now: datetime, settings: Settings) -> list[str]:
    """Live, unquarantined nodes with no open challenge and a claim due."""
    cutoff = now - timedelta(seconds=settings.node_offline_after_sec)
    nodes = (
        await session.scalars(
            select(NodeRow).where(NodeRow.last_seen_at >= cutoff, NodeRow.quarantined_at.is_(None))
        )
    ).all()
    busy = set(
        (
            await session.scalars(
                select(ChallengeRow.node_id).where(ChallengeRow.status.in_(OPEN)).distinct()
            )
        ).all()
    )
    failed = await _recent_failures(session, now - timedelta(seconds=settings.challenge_retry_sec))
    return [
        node.id
        for node in nodes
        if node.id not in busy and hardware_claims.due_claims(node, now, failed.get(node.id, set()))
    ]


async def issue_due(
    session: AsyncSession, node_id: str, now: datetime, settings: Settings
) -> ChallengeRow | None:
    """The node's next challenge, unless one is open or nothing is due."""
    node = await session.get(NodeRow, node_id, with_for_update=True)
    if node is None or node.quarantined_at is not None:
        return None
    open_one = await session.scalar(
        select(ChallengeRow.id).where(
            ChallengeRow.node_id == node_id, ChallengeRow.status.in_(OPEN)
        )
    )
    if open_one is not None:
        return None
    since = now - timedelta(seconds=settings.challenge_retry_sec)
    failed = (await _recent_failures(session, since, [node_id])).get(node_id, set())
    for claim in hardware_claims.due_claims(node, now, failed):
        params = params_for(claim, settings)
        if params is None:
            continue
        row = ChallengeRow(
            id=new_id("chl"),
            node_id=node_id,
            target=claim.target,
            claimed_model=claim.model,
            params=params.model_dump(mode="json"),
            seed=secrets.token_hex(16),
            status=ChallengeStatus.ISSUED,
            issued_at=now,
        )
        session.add(row)
        return row
    return None


_WAITING = Sql(
    "SELECT c.id AS challenge_id, c.target AS challenge_target,"
    " c.claimed_model AS challenge_model, c.params AS challenge_params, n.gpus AS node_gpus"
    " FROM challenges c JOIN nodes n ON n.id = c.node_id"
    " WHERE c.node_id = :node AND c.status = :issued ORDER BY c.issued_at LIMIT 1",
    jsons=("challenge_params", "node_gpus"),
)


async def waiting(db: Database, node_id: str) -> ChallengeOrder | None:
    """What the heartbeat answer tells the node: the challenge it has yet to start. Asked
    on every heartbeat that finds one waiting (`leases.heartbeat` says so), so it is one
    statement on the driver (`driver_sql`)."""
    async with db.driver_read() as tx:
        row = await tx.fetchrow(_WAITING, node=node_id, issued=ChallengeStatus.ISSUED.value)
    return None if row is None else order_of(row)


def order_of(row: Row) -> ChallengeOrder:
    """The order in a row of `_WAITING`."""
    target = row["challenge_target"]
    index = next(
        (int(g.get("index", 0)) for g in row["node_gpus"] or [] if g.get("uuid") == target),
        None,
    )
    params = row["challenge_params"]
    return ChallengeOrder(
        id=row["challenge_id"],
        kind=ChallengeKind(params["kind"]),
        target=target,
        gpu_index=index,
        claimed_model=row["challenge_model"],
        params=ChallengeParams.model_validate(params),
    )


async def _own(session: AsyncSession, node_id: str, challenge_id: str) -> ChallengeRow:
    """The node's challenge, locked; another node's is as absent as one never issued."""
    row = await session.get(ChallengeRow, challenge_id, with_for_update=True)
    if row is None or row.node_id != node_id:
        raise NotFound(f"challenge {challenge_id} does not exist")
    return row


def _over(row: ChallengeRow) -> Conflict:
    return Conflict(f"challenge {row.id} is {row.status}; it takes no more answers")


async def start(
    session: AsyncSession, node_id: str, challenge_id: str, now: datetime
) -> ChallengeStart:
    """The seed, once: the commit deadline counts from the first start (a repeated start,
    after a lost answer, gets the same seed and the same deadline)."""
    row = await _own(session, node_id, challenge_id)
    if row.status == ChallengeStatus.ISSUED:
        row.status, row.started_at = ChallengeStatus.STARTED, now
    elif row.status != ChallengeStatus.STARTED:
        raise _over(row)
    params = verdicts.params_of(row)
    assert row.started_at is not None
    return ChallengeStart(
        id=row.id,
        seed=row.seed,
        params=params,
        started_at=row.started_at,
        commit_by=verdicts.deadline(row.started_at, params),
    )


def choose_samples(seed: str, params: ChallengeParams, raw: bytes) -> list[dict[str, Any]]:
    """Random samples, never known before the commit, with the sketches committed for them."""
    from gpu_share.challenge import streams

    chunks = challenge_checks.shape_of(params).chunks
    shifts = streams.chunk_shifts(seed, params.steps, chunks)

    def committed(state: int, chunk: int) -> int | None:  # X_state's sketch; X₀ has none
        if state == 0:
            return None
        return int(struct.unpack_from("<i", raw, 4 * ((state - 1) * chunks + chunk))[0])

    picked: set[tuple[int, int]] = set()
    wanted = min(params.samples, params.steps * chunks)
    while len(picked) < wanted:
        picked.add((secrets.randbelow(params.steps), secrets.randbelow(chunks)))
    asked = []
    for step, chunk in sorted(picked):
        source = (chunk - shifts[step]) % chunks
        asked.append(
            {
                "step": step,
                "chunk": chunk,
                "source": source,
                "before": committed(step, chunk),
                "partner": committed(step, source),
                "after": committed(step + 1, chunk),
            }
        )
    return asked


def _committed_answer(row: ChallengeRow) -> ChallengeCommitted:
    params = verdicts.params_of(row)
    return ChallengeCommitted(
        samples=[
            ChallengeSample(step=a.step, chunk=a.chunk)
            for a in challenge_checks.asked_from(row.samples or {})
        ],
        reveal_by=verdicts.deadline(row.committed_at, params),
    )


async def commit(
    session: AsyncSession,
    node_id: str,
    challenge_id: str,
    body: ChallengeCommit,
    now: datetime,
    settings: Settings,
) -> ChallengeCommitted:
    """Take the sketches and choose what the node must reveal; a late commit fails the
    challenge (the answer says so), a repeated one gets the same samples."""
    row = await _own(session, node_id, challenge_id)
    raw = decode(body.sketches)
    digest = hashlib.sha256(raw).hexdigest()
    if row.status == ChallengeStatus.COMMITTED and (row.commitment or {}).get("sha256") == digest:
        return _committed_answer(row)
    if row.status != ChallengeStatus.STARTED:
        raise _over(row)
    params = verdicts.params_of(row)
    if now > verdicts.deadline(row.started_at, params):
        took = verdicts.seconds(row.started_at, now)
        late = f"committed {took} after the start; the deadline is {params.deadline_sec:g} s"
        verdict = await verdicts.decide(session, row, ChallengeStatus.FAILED, now, settings, late)
        return ChallengeCommitted(verdict=verdict)
    count = challenge_checks.shape_of(params).sketch_count
    expected = 4 * count
    if len(raw) != expected:
        raise field_error("sketches", f"{len(raw)} bytes; {count} int32 sketches are {expected}")
    row.status, row.committed_at = ChallengeStatus.COMMITTED, now
    row.commitment = {"sha256": digest, "sketches": count}
    row.samples = {"asked": choose_samples(row.seed, params, raw)}
    return _committed_answer(row)


async def history(
    session: AsyncSession, node_id: str, limit: int, *, provider_id: str | None = None
) -> list[Challenge]:
    """The node's challenges, latest first, with their verdicts; 404 unless the node exists
    (and, when `provider_id` is given, is that provider's)."""
    node = await session.get(NodeRow, node_id)
    if node is None or (provider_id is not None and node.provider_id != provider_id):
        raise NotFound(f"node {node_id} does not exist")
    rows = (
        await session.scalars(
            select(ChallengeRow)
            .where(ChallengeRow.node_id == node_id)
            .order_by(desc(ChallengeRow.issued_at), desc(ChallengeRow.id))
            .limit(min(limit, HISTORY_LIMIT))
        )
    ).all()
    return [
        Challenge(
            id=row.id,
            node_id=row.node_id,
            kind=ChallengeKind(row.params["kind"]),
            target=row.target,
            claimed_model=row.claimed_model,
            status=ChallengeStatus(row.status),
            issued_at=row.issued_at,
            started_at=row.started_at,
            committed_at=row.committed_at,
            finished_at=row.finished_at,
            params=verdicts.params_of(row),
            verdict=verdicts.verdict_of(row),
        )
        for row in rows
    ]
