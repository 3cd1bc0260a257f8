"""Where each claim of a machine stands with its challenges, for the provider's and the
admin's pages: the latest challenge per GPU (or "cpu"), read-only. Whether hardware is
verified is `NodeRow.verification`'s to say (`placement.gpu_proof`); this says why not
yet: a challenge waiting or running, or the last one failed and why."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import ChallengeRow
from gpu_share.protocol.trust import ChallengeStatus


@dataclass(frozen=True)
class LatestChallenge:
    status: ChallengeStatus
    at: datetime  # when it ended, or was issued while it has not
    reason: str | None  # why it failed or expired

    @property
    def pending(self) -> bool:
        return not self.status.final

    @property
    def failed(self) -> bool:
        return self.status in (ChallengeStatus.FAILED, ChallengeStatus.EXPIRED)


async def latest_by_target(
    session: AsyncSession, node_ids: Sequence[str]
) -> dict[str, dict[str, LatestChallenge]]:
    """Per node, per target (a GPU's UUID, or "cpu"): its latest challenge."""
    if not node_ids:
        return {}
    latest = (
        select(
            ChallengeRow.node_id,
            ChallengeRow.target,
            func.max(ChallengeRow.issued_at).label("issued_at"),
        )
        .where(ChallengeRow.node_id.in_(list(node_ids)))
        .group_by(ChallengeRow.node_id, ChallengeRow.target)
        .subquery()
    )
    rows = await session.execute(
        select(
            ChallengeRow.node_id,
            ChallengeRow.target,
            ChallengeRow.status,
            ChallengeRow.issued_at,
            ChallengeRow.finished_at,
            ChallengeRow.verdict,
        )
        .join(
            latest,
            (ChallengeRow.node_id == latest.c.node_id)
            & (ChallengeRow.target == latest.c.target)
            & (ChallengeRow.issued_at == latest.c.issued_at),
        )
        .order_by(ChallengeRow.id)
    )
    found: dict[str, dict[str, LatestChallenge]] = {}
    for node_id, target, status, issued_at, finished_at, verdict in rows.all():
        reason = (verdict or {}).get("reason")
        found.setdefault(node_id, {})[target] = LatestChallenge(
            status=ChallengeStatus(status),
            at=finished_at or issued_at,
            reason=str(reason) if reason else None,
        )
    return found
