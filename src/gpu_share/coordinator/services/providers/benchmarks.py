"""Benchmarks (SPEC §3.3): record a node's run, score it, list or delist its GPUs.

Each figure is compared with the reference of the GPU's model (`gpu_catalog`; a CPU
node: `gpu_catalog.CPU_BASELINE`), and the score is the weighted fraction reached:

    component score = min(1, measured / reference)
    GPU score  = 0.25 fp32 + 0.25 fp16 + 0.25 tensor + 0.25 memory bandwidth
                 (tensor: the mean of bf16 and tf32; a part not measured gives its
                 weight to the others)
    node score = 0.5 CPU matmul + 0.5 CPU memory bandwidth  (CPU baseline, per core)

A GPU passes when its score and every counted component reach its tier's thresholds
(`GPU_THRESHOLDS`, Enterprise stricter than Community) and its figures do not fit
another catalog model clearly better than the one it reports (`performs_like`); a CPU
node likewise with `CPU_THRESHOLDS`. Network and storage are scored and shown but
decide nothing: they depend on where the coordinator is as much as on the node. A GPU
of a model with no reference is shown unscored and never delisted for its figures.
docs/benchmarks.md says the same for people.

The verdict goes to `NodeRow.benchmark_state`, which placement reads:
`{"gpus": {uuid: verdict}, "node": verdict}`, each verdict `{"score", "passed",
"reason", "components", "at"}`; a GPU not scored this time keeps its last verdict, so
only a passing run relists it. Delisting and relisting mail the provider.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import NotFound, field_error
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import BenchmarkRunRow, NodeRow, ProviderRow
from gpu_share.coordinator.services.mail import mails, outbox
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.protocol.benchmarks import (
    BenchmarkReport,
    BenchmarkRequested,
    BenchmarkRun,
    BenchmarkTrigger,
    Component,
    CpuMeasurement,
    GpuMeasurement,
    GpuVerdict,
    Precision,
    Verdict,
)
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.provider_applications import GpuModelInfo


@dataclass(frozen=True)
class Thresholds:
    score: float  # the least score that passes
    component: float  # the least any one counted component may reach


GPU_THRESHOLDS = {
    Tier.ENTERPRISE: Thresholds(score=0.60, component=0.40),
    Tier.COMMUNITY: Thresholds(score=0.45, component=0.25),
}
CPU_THRESHOLDS = {
    Tier.ENTERPRISE: Thresholds(score=0.50, component=0.30),
    Tier.COMMUNITY: Thresholds(score=0.30, component=0.15),
}
GPU_WEIGHTS = {"fp32": 0.25, "fp16": 0.25, "tensor": 0.25, "memory_bandwidth": 0.25}
TENSOR_PARTS = ("bf16", "tf32")
CPU_WEIGHTS = {"cpu_matmul": 0.5, "cpu_memory": 0.5}
# A GPU "measures like" another catalog model when its figures fit that model better than
# its own by MODEL_MISMATCH_GAP. Misfit: the mean over its figures of
# |ln(measured / (TYPICAL × reference))|, TYPICAL being what a healthy card reaches of
# its datasheet in practice. The gap (0.3: figures about 35 % off) keeps siblings apart
# (an SXM card and its PCIe variant differ by about that) without flagging a card that is
# merely slow or unevenly fast.
MODEL_MISMATCH_GAP = 0.3
TYPICAL = 0.8
# Shown, never deciding: what a decent machine reaches, to put the figures in context.
STORAGE_WRITE_MBPS = 500.0
STORAGE_READ_MBPS = 1000.0
NETWORK_RTT_MS = 50.0
NETWORK_MBPS = 1000.0
HISTORY_LIMIT = 100
LABELS = {
    "fp32": "FP32 matmul",
    "fp16": "FP16 matmul",
    "bf16": "BF16 matmul",
    "tf32": "TF32 matmul",
    "memory_bandwidth": "memory bandwidth",
    "cpu_matmul": "CPU matmul",
    "cpu_memory": "CPU memory bandwidth",
    "storage_write": "storage write (synced)",
    "storage_read": "storage read (from disk)",
    "network_rtt": "round trip to the coordinator",
    "network_download": "download from the coordinator",
    "network_upload": "upload to the coordinator",
}


def _component(
    measured: float, reference: float | None, unit: str, *, counts: bool = True
) -> Component:
    score = None if not reference else round(min(1.0, measured / reference), 4)
    return Component(
        measured=round(measured, 3), reference=reference, unit=unit, score=score, counts=counts
    )


def _weighted(scores: dict[str, float], weights: dict[str, float]) -> float | None:
    present = {name: weight for name, weight in weights.items() if name in scores}
    if not present:
        return None
    total = sum(present.values())
    return round(sum(scores[name] * weight for name, weight in present.items()) / total, 4)


def _gpu_figures(gpu: GpuMeasurement) -> dict[str, float]:
    figures = {p.value: value for p in Precision if (value := gpu.tflops(p)) is not None}
    if gpu.memory_bandwidth_gbs is not None:
        figures["memory_bandwidth"] = gpu.memory_bandwidth_gbs
    return figures


def _reference(model: GpuModelInfo, name: str) -> float:
    if name == "memory_bandwidth":
        return model.memory_bandwidth_gbs
    value: float = getattr(model, f"{name}_tflops")
    return value


def gpu_score(figures: dict[str, float], model: GpuModelInfo) -> float | None:
    parts = {n: min(1.0, v / _reference(model, n)) for n, v in figures.items() if v >= 0}
    grouped = {n: s for n, s in parts.items() if n not in TENSOR_PARTS}
    tensor = [parts[n] for n in TENSOR_PARTS if n in parts]
    if tensor:
        grouped["tensor"] = sum(tensor) / len(tensor)
    return _weighted(grouped, GPU_WEIGHTS)


def misfit(figures: dict[str, float], model: GpuModelInfo) -> float:
    """How far the figures are from what a healthy `model` measures (0: exactly that)."""
    parts = [
        abs(math.log(max(value, 1e-9) / (TYPICAL * _reference(model, name))))
        for name, value in figures.items()
    ]
    return sum(parts) / len(parts)


def performs_like(figures: dict[str, float], claimed: GpuModelInfo) -> GpuModelInfo | None:
    """The catalog model these figures fit clearly better than `claimed`, if any."""
    if not figures:
        return None
    own = misfit(figures, claimed)
    best = min(gpu_catalog.REFERENCES.values(), key=lambda model: misfit(figures, model))
    if best.id != claimed.id and own - misfit(figures, best) >= MODEL_MISMATCH_GAP:
        return best
    return None


def _shortfalls(
    components: dict[str, Component], limits: Thresholds, tier: Tier, of: str
) -> list[str]:
    problems = []
    for name, part in components.items():
        if part.counts and part.score is not None and part.score < limits.component:
            problems.append(
                f"{LABELS.get(name, name)}: {part.measured:.1f} {part.unit} is "
                f"{part.score:.0%} of {of}'s {part.reference:g} {part.unit} "
                f"({tier.value.capitalize()} needs {limits.component:.0%})"
            )
    return problems


def score_gpu(gpu: GpuMeasurement, claimed: str, vram_mb: int, tier: Tier) -> GpuVerdict:
    """One GPU's verdict: `claimed` is the model its node reported (the inventory's)."""
    figures = _gpu_figures(gpu)
    model = gpu_catalog.match(claimed, vram_mb)
    unit = {name: "GB/s" if name == "memory_bandwidth" else "TFLOP/s" for name in figures}
    verdict = GpuVerdict(
        index=gpu.index,
        uuid=gpu.uuid,
        model=claimed,
        reference_model=model.id if model else None,
        score=None,
        passed=None,
        error=gpu.error,
        components={
            name: _component(value, _reference(model, name) if model else None, unit[name])
            for name, value in figures.items()
        },
    )
    if not figures:
        verdict.reason = f"not measured: {gpu.error or 'no figures'}"
        return verdict
    if model is None:
        verdict.reason = f"no reference figures for {claimed}: shown, not scored"
        return verdict
    score = gpu_score(figures, model)
    assert score is not None
    limits = GPU_THRESHOLDS[tier]
    problems = []
    like = performs_like(figures, model)
    if like is not None:
        verdict.performs_like = like.id
        problems.append(f"it measures like an {like.name}, not the {model.name} it reports")
    if score < limits.score:
        problems.append(
            f"score {score:.2f} against the {model.name}'s figures is below "
            f"{tier.value.capitalize()}'s {limits.score:.2f}"
        )
    problems += _shortfalls(verdict.components, limits, tier, f"the {model.name}")
    verdict.score = score
    verdict.passed = not problems
    verdict.reason = "; ".join(problems) or None
    return verdict


def score_node(report: BenchmarkReport, tier: Tier, cpu_node: bool) -> Verdict:
    """The node as a whole; only a CPU node can fail it (a GPU node is judged per GPU)."""
    components: dict[str, Component] = {}
    cpu: CpuMeasurement | None = report.cpu
    baseline = gpu_catalog.CPU_BASELINE
    if cpu is not None and cpu.matmul_gflops is not None:
        components["cpu_matmul"] = _component(
            cpu.matmul_gflops, baseline.matmul_gflops_per_core * cpu.cores, "GFLOP/s"
        )
    if cpu is not None and cpu.memory_bandwidth_gbs is not None:
        components["cpu_memory"] = _component(
            cpu.memory_bandwidth_gbs, baseline.memory_bandwidth_gbs, "GB/s"
        )
    if report.storage is not None:
        if report.storage.write_mbps is not None:
            components["storage_write"] = _component(
                report.storage.write_mbps, STORAGE_WRITE_MBPS, "MB/s", counts=False
            )
        if report.storage.read_mbps is not None:
            components["storage_read"] = _component(
                report.storage.read_mbps, STORAGE_READ_MBPS, "MB/s", counts=False
            )
    if report.network is not None:
        if (rtt := report.network.rtt_ms) is not None:
            components["network_rtt"] = Component(
                measured=round(rtt, 3),
                reference=NETWORK_RTT_MS,
                unit="ms",
                score=round(min(1.0, NETWORK_RTT_MS / max(rtt, 1e-6)), 4),
                counts=False,
            )
        for name, value in (
            ("network_download", report.network.download_mbps),
            ("network_upload", report.network.upload_mbps),
        ):
            if value is not None:
                components[name] = _component(value, NETWORK_MBPS, "Mbit/s", counts=False)
    counted = {n: c.score for n, c in components.items() if c.counts and c.score is not None}
    score = _weighted(counted, CPU_WEIGHTS)
    if score is None:
        return Verdict(score=None, passed=None, components=components)
    if not cpu_node:
        return Verdict(score=score, passed=True, components=components)
    limits = CPU_THRESHOLDS[tier]
    problems = []
    if score < limits.score:
        problems.append(
            f"score {score:.2f} against {baseline.name} per core is below "
            f"{tier.value.capitalize()}'s {limits.score:.2f}"
        )
    problems += _shortfalls(components, limits, tier, "the baseline")
    return Verdict(
        score=score, passed=not problems, reason="; ".join(problems) or None, components=components
    )


def _state_entry(verdict: Verdict, now: datetime) -> dict[str, Any]:
    return {
        "score": verdict.score,
        "passed": verdict.passed,
        "reason": verdict.reason,
        "components": {n: c.model_dump() for n, c in verdict.components.items()},
        "at": now.isoformat(),
    }


def _gpu_label(verdict: GpuVerdict) -> str:
    return f"GPU {verdict.index} ({verdict.model}, {verdict.uuid})"


async def _mail_changes(
    session: AsyncSession,
    node: NodeRow,
    run_id: str,
    changes: list[tuple[str, str, Verdict, bool]],
    now: datetime,
    base_url: str,
) -> None:
    """Mail the provider each verdict that delists or relists (`key`, what, verdict, listed)."""
    if not changes:
        return
    provider = await session.get(ProviderRow, node.provider_id)
    if provider is None:
        return
    page = f"{base_url}/provider/benchmarks#node-{node.id}"
    for key, what, verdict, listed in changes:
        if listed:
            mail = mails.benchmark_relisted(provider, node.hostname, what, verdict.score or 0, page)
            await outbox.enqueue(session, f"{run_id}:relisted:{key}", mail, now)
        else:
            reason = "\n".join(f"- {part}" for part in (verdict.reason or "").split("; "))
            mail = mails.benchmark_delisted(provider, node.hostname, what, reason, page)
            await outbox.enqueue(session, f"{run_id}:delisted:{key}", mail, now)


def _changed(previous: Any, verdict: Verdict) -> bool | None:
    """True: relisted; False: delisted; None: no change worth a mail."""
    was_failing = isinstance(previous, dict) and previous.get("passed") is False
    if verdict.passed is False and not was_failing:
        return False
    if verdict.passed is True and was_failing:
        return True
    return None


async def record(
    session: AsyncSession, node_id: str, report: BenchmarkReport, now: datetime, base_url: str
) -> BenchmarkRun:
    """Keep the run, score it, update what placement reads, and mail what changed."""
    node = await session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    inventory = {str(g.get("uuid")): g for g in node.gpus}
    for position, gpu in enumerate(report.gpus):
        if gpu.uuid not in inventory:
            raise field_error(
                f"gpus.{position}.uuid",
                f"GPU {gpu.uuid} is not in this node's inventory; send the inventory first",
            )
    tier = Tier(node.tier)
    run_id = new_id("bmk")
    verdicts = [
        score_gpu(
            gpu,
            str(inventory[gpu.uuid].get("model", gpu.model)),
            int(inventory[gpu.uuid].get("vram_mb", 0)),
            tier,
        )
        for gpu in report.gpus
    ]
    node_verdict = score_node(report, tier, cpu_node=not node.gpus)
    state: dict[str, Any] = node.benchmark_state or {}
    previous_gpus: dict[str, Any] = state.get("gpus") or {}
    gpus = {uuid: v for uuid, v in previous_gpus.items() if uuid in inventory}
    changes: list[tuple[str, str, Verdict, bool]] = []
    for verdict in verdicts:
        if verdict.score is None or verdict.passed is None:
            continue  # unscored: the last verdict stands
        if (listed := _changed(previous_gpus.get(verdict.uuid), verdict)) is not None:
            changes.append((verdict.uuid, _gpu_label(verdict), verdict, listed))
        gpus[verdict.uuid] = _state_entry(verdict, now)
    new_state: dict[str, Any] = {"gpus": gpus}
    if node_verdict.score is not None and node_verdict.passed is not None:
        if (listed := _changed(state.get("node"), node_verdict)) is not None and not node.gpus:
            changes.append(("node", "this machine", node_verdict, listed))
        new_state["node"] = _state_entry(node_verdict, now)
    elif isinstance(state.get("node"), dict):
        new_state["node"] = state["node"]
    node.benchmark_state = new_state
    node.last_benchmark_at = now
    started_at = now - timedelta(milliseconds=report.duration_ms)
    requested = node.benchmark_requested_at
    if requested is not None and (
        report.trigger is BenchmarkTrigger.REQUESTED or started_at >= requested
    ):
        node.benchmark_requested_at = None
    judged: list[Verdict] = [v for v in verdicts if v.passed is not None]
    if not node.gpus and node_verdict.passed is not None:
        judged.append(node_verdict)
    failures = [
        f"{_gpu_label(v) if isinstance(v, GpuVerdict) else 'the machine'}: {v.reason}"
        for v in judged
        if v.passed is False
    ]
    scores = {
        "tier": tier.value,
        "passed": not failures,
        "reason": "; ".join(failures) or None,
        "gpus": [v.model_dump(mode="json") for v in verdicts],
        "node": node_verdict.model_dump(mode="json"),
    }
    row = BenchmarkRunRow(
        id=run_id,
        node_id=node_id,
        trigger=report.trigger.value,
        started_at=started_at,
        finished_at=now,
        report=report.model_dump(mode="json"),
        scores=scores,
        passed=not failures,
    )
    session.add(row)
    await session.flush()
    await _mail_changes(session, node, run_id, changes, now, base_url)
    return to_wire(row)


def to_wire(row: BenchmarkRunRow, *, with_errors: bool = True) -> BenchmarkRun:
    scores = row.scores
    return BenchmarkRun(
        id=row.id,
        node_id=row.node_id,
        trigger=BenchmarkTrigger(row.trigger),
        started_at=row.started_at,
        finished_at=row.finished_at,
        passed=row.passed,
        reason=scores.get("reason"),
        tier=str(scores.get("tier", "")),
        gpus=[GpuVerdict.model_validate(g) for g in scores.get("gpus", [])],
        node=Verdict.model_validate(scores.get("node") or {"score": None, "passed": None}),
        errors=list(row.report.get("errors", [])) if with_errors else [],
    )


async def request(session: AsyncSession, node_id: str, now: datetime) -> BenchmarkRequested:
    """An admin asks: the node's next heartbeat answer says run_benchmark until it reports."""
    node = await session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    if node.benchmark_requested_at is None:
        node.benchmark_requested_at = now
    return BenchmarkRequested(node_id=node.id, requested_at=node.benchmark_requested_at)


async def history(
    session: AsyncSession, node_id: str, limit: int = 20, *, with_errors: bool = True
) -> list[BenchmarkRun]:
    """The node's runs, newest first."""
    rows = await session.scalars(
        select(BenchmarkRunRow)
        .where(BenchmarkRunRow.node_id == node_id)
        .order_by(BenchmarkRunRow.finished_at.desc(), BenchmarkRunRow.id.desc())
        .limit(max(1, min(limit, HISTORY_LIMIT)))
    )
    return [to_wire(row, with_errors=with_errors) for row in rows.all()]


async def requested(session: AsyncSession, node_ids: list[str]) -> dict[str, datetime]:
    """When an admin asked each of these nodes for a run it has not reported yet."""
    if not node_ids:
        return {}
    rows = await session.execute(
        select(NodeRow.id, NodeRow.benchmark_requested_at).where(
            NodeRow.id.in_(node_ids), NodeRow.benchmark_requested_at.is_not(None)
        )
    )
    return {node_id: at for node_id, at in rows.all() if at is not None}


async def node_of_provider(session: AsyncSession, node_id: str, provider_id: str) -> NodeRow:
    node = await session.get(NodeRow, node_id)
    if node is None or node.provider_id != provider_id:
        raise NotFound(f"node {node_id} does not exist")
    return node


async def node_exists(session: AsyncSession, node_id: str) -> NodeRow:
    node = await session.get(NodeRow, node_id)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    return node
