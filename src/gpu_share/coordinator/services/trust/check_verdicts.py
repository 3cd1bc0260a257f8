"""Concluding spot checks: a check invoke that ended is compared with the job it re-ran,
and the verdict recorded (docs/trust.md, "Spot checks").

    checked job:  pending ──match / inconclusive──▶ match / inconclusive
                     │
                     └─mismatch──▶ confirming ──a second check agrees──▶ mismatch (caught)
                                        └──────otherwise──────────────▶ inconclusive

A mismatch is never acted on alone: a second check runs the job again on a trusted node,
and the node is caught only if that one disagrees with the node too and agrees with the
first (ONNX outputs within tolerance of each other). A job the platform cannot reproduce
(a model that samples at random, a flaky failure) is so found out and counts for
nothing; so does a trusted node that went wrong once.

Where the outputs are is read in one transaction, the bytes and the comparison happen
outside any (`check_outputs`, in a thread), and the verdict is written in a second,
guarded by the check's and the job's states: a replica that concluded it first wins,
and the other writes nothing.
"""

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.trust import (
    check_outputs,
    consequences,
    spot_check_rates,
    spot_checks,
)
from gpu_share.coordinator.services.trust.check_outputs import OutputsTooLarge, StoredOutputs
from gpu_share.coordinator.services.trust.comparison import (
    Outcome,
    Tolerances,
    Verdict,
    compare_outputs,
)
from gpu_share.coordinator.services.trust.consequences import Caught, IncidentKind
from gpu_share.coordinator.services.trust.failure_comparison import (
    FailureFacts,
    Margins,
    compare_failure,
)
from gpu_share.coordinator.services.trust.spot_check_rates import RatePolicy
from gpu_share.coordinator.services.trust.training_comparison import compare_training
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.npz_reading import Array
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.runtimes import RuntimeName

ENDED = [s.value for s in (InvokeStatus.DONE, InvokeStatus.FAILED, InvokeStatus.TIMEOUT)]
ENDED.append(InvokeStatus.CANCELED.value)
MiB = 1024 * 1024

Outputs = dict[str, Array] | str  # the arrays, or why there are none


@dataclass(frozen=True)
class Concluded:
    check_id: str
    invoke_id: str
    state: CheckState  # where the checked job stands now
    caught: Caught | None = None


@dataclass(frozen=True)
class _Gathered:
    check: InvokeRow
    checked: InvokeRow
    first: InvokeRow | None  # the check a confirmation confirms
    facts: FailureFacts | None
    places: dict[str, StoredOutputs]  # "node", "check", "first"


async def finished(session: AsyncSession) -> list[str]:
    """Checks that ended and are not concluded yet, oldest first."""
    rows = await session.scalars(
        select(InvokeRow.id)
        .where(
            InvokeRow.check_of.is_not(None),
            InvokeRow.status.in_(ENDED),
            InvokeRow.check_state.is_(None),
        )
        .order_by(InvokeRow.finished_at, InvokeRow.id)
        .limit(spot_checks.BATCH)
    )
    return list(rows.all())


async def conclude(
    db: Database, store: ArtifactStore, settings: Settings, check_id: str, now: datetime
) -> Concluded | None:
    """Compare one ended check with its job and record what it found; None when there is
    nothing (left) to conclude."""
    async with db.read() as session:
        gathered = await _gather(session, check_id, now)
    if gathered is None:
        return None
    verdict, consistent = await _judge(gathered, store, settings)
    async with db.write() as session:
        return await _record(session, gathered, verdict, consistent, now, settings)


async def _gather(session: AsyncSession, check_id: str, now: datetime) -> _Gathered | None:
    check = await session.get(InvokeRow, check_id)
    if check is None or check.check_of is None or check.check_state is not None:
        return None
    checked = await session.get(InvokeRow, check.check_of)
    if checked is None:
        return None
    first = None
    if checked.check_state == CheckState.CONFIRMING.value:
        first = await session.scalar(
            select(InvokeRow)
            .where(
                InvokeRow.check_of == checked.id,
                InvokeRow.id != check.id,
                InvokeRow.check_state == CheckState.MISMATCH.value,
            )
            .order_by(InvokeRow.created_at.desc())
            .limit(1)
        )
    places: dict[str, StoredOutputs] = {}
    facts = None
    if checked.status == InvokeStatus.DONE.value:
        places["node"] = await check_outputs.locate(session, checked, now)
        if check.status == InvokeStatus.DONE.value:
            places["check"] = await check_outputs.locate(session, check, now)
        if first is not None and first.status == InvokeStatus.DONE.value:
            places["first"] = await check_outputs.locate(session, first, now)
    else:
        nodes = [checked.node_id, check.node_id]
        rows = {n: await session.get(NodeRow, n) for n in nodes if n is not None}
        facts = failure_facts(
            checked, check, rows.get(checked.node_id or ""), rows.get(check.node_id or "")
        )
    return _Gathered(check, checked, first, facts, places)


async def _judge(
    gathered: _Gathered, store: ArtifactStore, settings: Settings
) -> tuple[Verdict, Verdict | None]:
    """The check's verdict on the job, and for a confirmation whether the two checks agree."""
    tol = Tolerances.of(settings)
    checked, check = gathered.checked, gathered.check
    if checked.status != InvokeStatus.DONE.value:
        assert gathered.facts is not None and checked.error_code is not None
        verdict = compare_failure(
            checked.error_code,
            check.status == InvokeStatus.DONE.value,
            check.error_code,
            gathered.facts,
            Margins(settings.spot_check_timeout_margin, settings.spot_check_memory_margin),
        )
        return verdict, verdict
    if check.status != InvokeStatus.DONE.value:
        return Verdict.inconclusive(f"the check ended {check.status} ({check.error_code})"), None
    limit = settings.spot_check_max_output_bytes
    try:
        read = {
            name: await check_outputs.read(place, store, limit)
            for name, place in gathered.places.items()
        }
    except OutputsTooLarge as exc:
        return Verdict.inconclusive(f"outputs too large to compare ({exc})"), None
    return await asyncio.to_thread(_compare_done, checked, read, tol)


def _compare_done(
    checked: InvokeRow, read: dict[str, Outputs], tol: Tolerances
) -> tuple[Verdict, Verdict | None]:
    trusted = read["check"]
    if isinstance(trusted, str):
        return Verdict.inconclusive(f"the trusted node's outputs are unreadable: {trusted}"), None
    node = read["node"]
    if RuntimeName(checked.runtime).kind == "train":
        verdict = compare_training(node, trusted, tol)
        return verdict, verdict  # scoring one model is deterministic: no second opinion needed
    if isinstance(node, str):
        verdict = Verdict.mismatch(f"the outputs it returned are unreadable: {node}")
    else:
        verdict = compare_outputs(node, trusted, tol)
    first = read.get("first")
    if first is None:
        return verdict, None
    if isinstance(first, str):
        return verdict, Verdict.inconclusive(f"the first check's outputs are unreadable: {first}")
    return verdict, compare_outputs(first, trusted, tol)


async def _record(
    session: AsyncSession,
    gathered: _Gathered,
    verdict: Verdict,
    consistent: Verdict | None,
    now: datetime,
    settings: Settings,
) -> Concluded | None:
    check, read_checked = gathered.check, gathered.checked
    concluded = await session.execute(
        update(InvokeRow)
        .where(InvokeRow.id == check.id, InvokeRow.check_state.is_(None))
        .values(check_state=verdict.outcome.value)
    )
    if concluded.rowcount != 1:  # type: ignore[attr-defined]
        return None  # another replica concluded it
    expected = read_checked.check_state
    if expected == CheckState.PENDING.value:
        state = (
            CheckState.CONFIRMING
            if verdict.outcome is Outcome.MISMATCH
            else CheckState(verdict.outcome.value)
        )
    elif expected == CheckState.CONFIRMING.value and gathered.first is not None:
        confirmed = (
            verdict.outcome is Outcome.MISMATCH
            and consistent is not None
            and (consistent.outcome is Outcome.MATCH or consistent is verdict)
        )
        state = CheckState.MISMATCH if confirmed else CheckState.INCONCLUSIVE
    else:
        return Concluded(check.id, read_checked.id, CheckState(expected or "skipped"))
    moved = await session.execute(
        update(InvokeRow)
        .where(InvokeRow.id == read_checked.id, InvokeRow.check_state == expected)
        .values(check_state=state.value)
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return Concluded(check.id, read_checked.id, CheckState(expected or "skipped"))
    checked = await session.get(InvokeRow, read_checked.id, populate_existing=True)
    assert checked is not None and checked.node_id is not None
    if state is CheckState.CONFIRMING:
        spot_checks.create_check(session, checked, now, settings)
        return Concluded(check.id, checked.id, state)
    node = await spot_check_rates.locked_node(session, checked.node_id)
    if node is not None:
        spot_check_rates.record_outcome(
            node, checked.runtime, Outcome(state.value), RatePolicy.of(settings)
        )
    caught = None
    if state is CheckState.MISMATCH:
        caught = await consequences.catch(
            session,
            checked=checked,
            check=check,
            kind=IncidentKind.RESULT_MISMATCH
            if read_checked.status == InvokeStatus.DONE.value
            else IncidentKind.FAILURE_NOT_REPRODUCED,
            evidence=evidence(gathered, verdict, consistent),
            now=now,
            base_url=settings.public_base_url.rstrip("/"),
        )
    return Concluded(check.id, checked.id, state, caught)


def _ending(row: InvokeRow) -> dict[str, Any]:
    return {
        "invoke_id": row.id,
        "node_id": row.node_id,
        "status": row.status,
        "error_code": row.error_code,
        "error_message": row.error_message,
        "result": row.result,
    }


def evidence(gathered: _Gathered, verdict: Verdict, consistent: Verdict | None) -> dict[str, Any]:
    """What the admin sees of a catch: both results as they came, what the job ran on,
    and what the comparisons found (JSON)."""
    checked, first = gathered.checked, gathered.first
    return {
        "reason": verdict.reason,
        "runtime": checked.runtime,
        "model_sha256": checked.model_sha256,
        "inputs_sha256": checked.inputs_sha256,
        "timeout_sec": checked.timeout_sec,
        "node": _ending(checked),
        "trusted": _ending(gathered.check),
        "first_check": _ending(first) if first is not None else None,
        "comparison": verdict.details,
        "checks_agree": None
        if consistent is None or consistent is verdict
        else {
            "outcome": consistent.outcome.value,
            "reason": consistent.reason,
        },
    }


# The machines a failure is judged by (`failure_comparison`)


def _gpus_of(node: NodeRow, row: InvokeRow) -> list[dict[str, Any]]:
    wanted = {int(i) for i in row.gpu_indices or []}
    gpus = [g for g in node.gpus if not wanted or int(g.get("index", -1)) in wanted]
    return gpus or list(node.gpus)


def _speed(node: NodeRow, row: InvokeRow) -> tuple[float, ...] | None:
    if not RuntimeName(row.runtime).needs_gpu:
        return (float(node.cpu_count),) if node.cpu_count else None
    gpus = _gpus_of(node, row)
    if not gpus:
        return None
    model = gpu_catalog.match(str(gpus[0].get("model", "")), int(gpus[0].get("vram_mb", 0) or 0))
    if model is None:
        return None
    return (model.fp32_tflops, model.fp16_tflops, model.memory_bandwidth_gbs)


def _memory_bytes(node: NodeRow, row: InvokeRow) -> int | None:
    if RuntimeName(row.runtime).needs_gpu:
        sizes = [int(g.get("vram_mb", 0) or 0) for g in _gpus_of(node, row)]
        return min(sizes) * MiB if sizes and min(sizes) > 0 else None
    limit = node.job_memory_mb or node.ram_mb
    return int(limit) * MiB if limit else None


def failure_facts(
    checked: InvokeRow, check: InvokeRow, node: NodeRow | None, trusted: NodeRow | None
) -> FailureFacts:
    metrics = (check.result or {}).get("metrics") or {}
    took = metrics.get("duration_ms")
    gpu = RuntimeName(checked.runtime).needs_gpu
    peak = metrics.get("peak_gpu_memory_bytes" if gpu else "peak_rss_bytes")
    speedup = None
    if node is not None and trusted is not None:
        mine, theirs = _speed(node, checked), _speed(trusted, check)
        if mine is not None and theirs is not None and all(m > 0 for m in mine):
            speedup = max(1.0, *(t / m for t, m in zip(theirs, mine, strict=True)))
    return FailureFacts(
        timeout_sec=checked.timeout_sec,
        check_ms=took if isinstance(took, int) else None,
        check_peak_bytes=peak if isinstance(peak, int) else None,
        node_memory_bytes=_memory_bytes(node, checked) if node is not None else None,
        speedup=speedup,
    )
