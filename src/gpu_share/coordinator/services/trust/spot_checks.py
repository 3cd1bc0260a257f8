"""Which ended jobs are run again on a trusted node, and the check invokes that do it
(docs/trust.md, "Spot checks").

The decision is taken once per invoke, after it ended, at its node's rate for its runtime
(`spot_check_rates`): the node ran the job as any other and cannot tell whether it is
checked. Jobs that ended done, or failed with a failure the tenant is charged for
(`CHECKED_FAILURES`), are decided; a job of a trusted or quarantined node, or one whose
outputs went to the tenant's own storage (the platform never saw them), is skipped.

A check is a copy of the job: same runtime, model, inputs, checksums, timeout and GPU
count, none of the tenant's placement wishes, never its `outputs_upload`. It is spot
work (on-demand work goes first and may preempt it), costs nobody anything, is hidden
from the tenant, and only a trusted node other than the job's own takes it (`claims`).
A check no trusted node took within `spot_check_wait_sec` is dropped (failed with
NO_CAPACITY) and counts as inconclusive.
"""

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.services.nodes.placement import Requirements
from gpu_share.coordinator.services.nodes.trusted import TrustRule, is_trusted
from gpu_share.coordinator.services.trust import spot_check_rates
from gpu_share.coordinator.services.trust.failure_comparison import CHECKED_FAILURES
from gpu_share.coordinator.services.trust.spot_check_rates import RatePolicy
from gpu_share.coordinator.services.work import invoke_state
from gpu_share.coordinator.services.work.invokes import outputs_artifact_id
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeStatus, Priority
from gpu_share.protocol.runtimes import RuntimeName

BATCH = 200  # invokes decided, dropped or concluded in one pass
_RANDOM = secrets.SystemRandom()  # not the module's: nothing a node sees predicts it


def _ended_as_checked() -> object:
    failed = InvokeRow.status.in_([InvokeStatus.FAILED.value, InvokeStatus.TIMEOUT.value])
    return or_(
        InvokeRow.status == InvokeStatus.DONE.value,
        and_(failed, InvokeRow.error_code.in_([code.value for code in CHECKED_FAILURES])),
    )


async def undecided(session: AsyncSession, now: datetime, settings: Settings) -> list[str]:
    """Invokes that ended recently, as the spot checks judge, with no decision yet; the
    oldest first. The window keeps the scan to recent rows (the status index)."""
    since = now - timedelta(seconds=settings.spot_check_decide_within_sec)
    rows = await session.scalars(
        select(InvokeRow.id)
        .where(
            InvokeRow.status.in_(
                [InvokeStatus.DONE.value, InvokeStatus.FAILED.value, InvokeStatus.TIMEOUT.value]
            ),
            InvokeRow.created_at >= since - timedelta(seconds=settings.max_timeout_sec),
            InvokeRow.finished_at >= since,
            InvokeRow.check_state.is_(None),
            InvokeRow.check_of.is_(None),
            InvokeRow.node_id.is_not(None),
            _ended_as_checked(),  # type: ignore[arg-type]
        )
        .order_by(InvokeRow.finished_at, InvokeRow.id)
        .limit(BATCH)
    )
    return list(rows.all())


def checkable(row: InvokeRow) -> bool:
    """A failure always; a result only when the platform holds its outputs."""
    if row.status != InvokeStatus.DONE.value:
        return True
    result = row.result or {}
    inline = result.get("outputs_inline_base64")
    return bool(inline) or outputs_artifact_id(result) is not None


async def decide(
    session: AsyncSession,
    invoke_id: str,
    now: datetime,
    settings: Settings,
    *,
    draw: float | None = None,
) -> InvokeRow | None:
    """`decide_all` for one invoke: the check invoke if one was made. `draw`: the random
    number in [0, 1) (tests); a fresh one otherwise."""
    made = await decide_all(
        session, [invoke_id], now, settings, draws=None if draw is None else {invoke_id: draw}
    )
    return made[0] if made else None


async def decide_all(
    session: AsyncSession,
    invoke_ids: Sequence[str],
    now: datetime,
    settings: Settings,
    *,
    draws: Mapping[str, float] | None = None,
) -> list[InvokeRow]:
    """Pick each invoke for a check, or not, once; returns the check invokes made.

    A batch reads its invokes and their nodes once (the nodes locked in id order, so
    replicas deciding at once never deadlock) and records the decisions with one guarded
    UPDATE per outcome; the flush then writes each node's record once and the checks made.
    It was three statements and a node lock per invoke (bench/README.md). A node's rate
    depends on its streak of matches, which only a check's outcome changes, so the
    invokes of one batch are decided at the rate it had before. `draws`: the random
    number in [0, 1) per invoke (tests); fresh ones otherwise."""
    rows = (
        await session.scalars(
            select(InvokeRow)
            .where(
                InvokeRow.id.in_(invoke_ids),
                InvokeRow.check_state.is_(None),
                InvokeRow.node_id.is_not(None),
            )
            .order_by(InvokeRow.finished_at, InvokeRow.id)
        )
    ).all()
    if not rows:
        return []
    nodes = await spot_check_rates.locked_nodes(
        session, {row.node_id for row in rows if row.node_id is not None}
    )
    policy, rule = RatePolicy.of(settings), TrustRule.of(settings)
    states: dict[CheckState, list[tuple[InvokeRow, NodeRow]]] = {
        CheckState.PENDING: [],
        CheckState.SKIPPED: [],
    }
    exempt: set[str] = set()
    for row in rows:
        if row.node_id is None or (node := nodes.get(row.node_id)) is None:
            continue
        if node.quarantined_at is not None or is_trusted(node, rule) or not checkable(row):
            exempt.add(row.id)
        draw = draws[row.id] if draws is not None else _RANDOM.random()
        rate = spot_check_rates.current_rate(node, row.runtime, policy)
        chosen = row.id not in exempt and draw < rate
        states[CheckState.PENDING if chosen else CheckState.SKIPPED].append((row, node))
    made: list[InvokeRow] = []
    for state, picked in states.items():
        if not picked:
            continue
        decided = set(
            (
                await session.scalars(
                    update(InvokeRow)
                    .where(
                        InvokeRow.id.in_([row.id for row, _ in picked]),
                        InvokeRow.check_state.is_(None),
                    )
                    .values(check_state=state.value)
                    .returning(InvokeRow.id)
                )
            ).all()
        )  # without the ones another replica decided meanwhile
        for row, node in picked:
            if row.id not in decided:
                continue
            if row.id not in exempt:
                chosen = state is CheckState.PENDING
                spot_check_rates.record_decision(node, row.runtime, chosen, policy)
            if state is CheckState.PENDING:
                made.append(create_check(session, row, now, settings))
    return made


def create_check(
    session: AsyncSession, checked: InvokeRow, now: datetime, settings: Settings
) -> InvokeRow:
    """A copy of `checked` for a trusted node (module doc), queued."""
    runtime = RuntimeName(checked.runtime)
    needs = Requirements.of(checked)
    row = InvokeRow(
        id=new_id("inv"),
        tenant_id=checked.tenant_id,  # the artifacts are the tenant's; nothing is charged
        status=InvokeStatus.QUEUED.value,
        runtime=checked.runtime,
        priority=Priority.SPOT.value,
        model_url=checked.model_url,
        inputs_url=checked.inputs_url,
        model_artifact_id=checked.model_artifact_id,
        inputs_artifact_id=checked.inputs_artifact_id,
        model_sha256=checked.model_sha256,
        inputs_sha256=checked.inputs_sha256,
        timeout_sec=checked.timeout_sec,
        gpus=checked.gpus,
        constraints=Requirements(
            runtime=runtime, gpus=checked.gpus, min_vram_mb=needs.min_vram_mb
        ).constraints(),
        outputs_upload=None,
        warnings=[],
        attempts=0,
        max_attempts=settings.max_attempts,
        created_at=now,
        log_bytes=0,
        reserved_micro=0,
        cost_micro=0,
        check_of=checked.id,
    )
    session.add(row)
    return row


async def stale_checks(session: AsyncSession, now: datetime, settings: Settings) -> list[str]:
    """Checks still queued after `spot_check_wait_sec`: no trusted node took them."""
    rows = await session.scalars(
        select(InvokeRow.id)
        .where(
            InvokeRow.status == InvokeStatus.QUEUED.value,
            InvokeRow.check_of.is_not(None),
            InvokeRow.created_at < now - timedelta(seconds=settings.spot_check_wait_sec),
        )
        .limit(BATCH)
    )
    return list(rows.all())


async def drop(session: AsyncSession, check_ids: Sequence[str], now: datetime) -> int:
    """End checks no trusted node took (their conclusion is then inconclusive)."""
    dropped = 0
    for check_id in check_ids:
        dropped += await invoke_state.fail_queued(
            session,
            check_id,
            ErrorCode.NO_CAPACITY,
            "no trusted node took this spot check in time",
            now,
        )
    return dropped


async def waiting(session: AsyncSession) -> int:
    """Checks queued for a trusted node now (the admin's overview)."""
    count = await session.scalar(
        select(func.count())
        .select_from(InvokeRow)
        .where(InvokeRow.status == InvokeStatus.QUEUED.value, InvokeRow.check_of.is_not(None))
    )
    return int(count or 0)


async def trusted_nodes(session: AsyncSession, settings: Settings) -> list[NodeRow]:
    """The nodes that take checks now: marked, or trusted on their record."""
    rule = TrustRule.of(settings)
    rows = await session.scalars(select(NodeRow).where(NodeRow.quarantined_at.is_(None)))
    return [node for node in rows.all() if is_trusted(node, rule)]
