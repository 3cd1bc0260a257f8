"""The published reliability score (SPEC §3.7): records read from the database, scored
by `reliability_formula`, and stored on nodes and providers.

`load_records` reads any number of nodes in a few grouped queries: presence counted per
hour in SQL, per schedule (the windows become UTC ranges in the query), job and session
outcomes per hour, and benchmark runs with each node's first. `refresh_all` (the
reliability loop) publishes every node's and provider's score as JSON of `Reliability`,
which placement, `/v1/nodes` and offers read.
"""

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Label,
    and_,
    cast,
    extract,
    func,
    literal_column,
    or_,
    select,
)
from sqlalchemy import update as sql_update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import (
    BenchmarkRunRow,
    InvokeRow,
    NodePresenceRow,
    NodeRow,
    ProviderRow,
    SessionRow,
)
from gpu_share.coordinator.services.nodes.placement import stored_reliability
from gpu_share.coordinator.services.nodes.presence import bucket_of
from gpu_share.coordinator.services.nodes.schedules import open_intervals, parse_availability
from gpu_share.coordinator.services.providers.reliability_formula import (
    NEUTRAL,
    PROVIDER_SIDE,
    STEP_SEC,
    BenchmarkScores,
    JobOutcome,
    NodeRecord,
    combine,
    evaluation_times,
    lookback_start,
    outcome,
    point,
    score,
    series,
    start_of,
    starting_score,
    step_start,
)
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.reliability import (
    NodeReliability,
    ProviderReliability,
    Reliability,
    ReliabilityPoint,
)
from gpu_share.protocol.schedules import Availability
from gpu_share.protocol.sessions import SessionStatus

_CHUNK = 500  # node ids per query


@dataclass(frozen=True)
class NodeFacts:
    id: str
    provider_id: str
    hostname: str
    registered_at: datetime
    availability: Availability
    start: float = NEUTRAL  # the score it started from (`starting_score`)


def _hour(column: Any, dialect: str) -> Label[int]:
    """The UTC hour a timestamp falls in (seconds since the epoch // 3600), labelled
    `hour` so GROUP BY names it rather than repeating it with its own parameters."""
    if dialect == "postgresql":
        seconds: ColumnElement[int] = cast(func.floor(extract("epoch", column)), BigInteger)
    else:
        seconds = cast(func.strftime("%s", column), Integer)
    return seconds.op("/")(literal_column(str(STEP_SEC))).label("hour")


async def node_facts(session: AsyncSession, *where: ColumnElement[bool]) -> list[NodeFacts]:
    rows = await session.execute(
        select(
            NodeRow.id,
            NodeRow.provider_id,
            NodeRow.hostname,
            NodeRow.registered_at,
            NodeRow.availability,
            NodeRow.reliability,
        )
        .where(*where)
        .order_by(NodeRow.registered_at, NodeRow.id)
    )
    return [
        NodeFacts(
            r.id,
            r.provider_id,
            r.hostname,
            r.registered_at,
            parse_availability(r.availability),
            start_of(stored_reliability(r.reliability)),
        )
        for r in rows
    ]


def starting_reliability(provider: ProviderRow, registered_at: datetime) -> dict[str, Any]:
    """The score a new node of `provider` is published with at registration, before the
    reliability loop has seen it: its provider's published score (`starting_score`)."""
    published = stored_reliability(provider.reliability)
    start = starting_score(published.score if published is not None else None)
    initial = score(NodeRecord(registered_at, start=start), registered_at)
    return initial.model_dump(mode="json")


async def load_records(
    session: AsyncSession, nodes: Sequence[NodeFacts], start: datetime, now: datetime
) -> dict[str, NodeRecord]:
    """The nodes' records from `start` to `now`: presence counted per hour in SQL, grouped
    by schedule (the windows become UTC ranges in the query), and outcomes per hour."""
    dialect = session.get_bind().dialect.name
    online: dict[str, dict[datetime, int]] = {n.id: {} for n in nodes}
    outcomes: dict[str, list[JobOutcome]] = {n.id: [] for n in nodes}
    runs: dict[str, list[BenchmarkScores]] = {n.id: [] for n in nodes}
    ended = bucket_of(now)
    groups: defaultdict[str, list[NodeFacts]] = defaultdict(list)
    for node in nodes:
        groups[json.dumps(node.availability.model_dump(mode="json"), sort_keys=True)].append(node)
    for members in groups.values():
        intervals = open_intervals(members[0].availability, start, ended)
        if not intervals:
            continue
        hour = _hour(NodePresenceRow.bucket_start, dialect)
        inside = or_(
            *(
                and_(NodePresenceRow.bucket_start >= lo, NodePresenceRow.bucket_start < hi)
                for lo, hi in intervals
            )
        )
        for ids in _chunks([m.id for m in members]):
            rows = await session.execute(
                select(NodePresenceRow.node_id, hour, func.count())
                .where(NodePresenceRow.node_id.in_(ids), NodePresenceRow.beats > 0, inside)
                .group_by(NodePresenceRow.node_id, "hour")
            )
            for node_id, step, count in rows:
                online[node_id][step_start(int(step))] = int(count)
    for ids in _chunks([n.id for n in nodes]):
        for node_id, step, completed, code, count in await _outcome_rows(
            session, ids, start, now, dialect
        ):
            if found := outcome(step_start(int(step)), completed, code, int(count)):
                outcomes[node_id].append(found)
        for node_id, at, scores in await _benchmark_rows(session, ids, start, now):
            if values := benchmark_scores(scores):
                runs[node_id].append(BenchmarkScores(at, values))
    return {
        n.id: NodeRecord(
            n.registered_at, n.availability, online[n.id], outcomes[n.id], runs[n.id], n.start
        )
        for n in nodes
    }


def _chunks(ids: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(ids), _CHUNK):
        yield ids[i : i + _CHUNK]


async def _outcome_rows(
    session: AsyncSession, ids: list[str], start: datetime, now: datetime, dialect: str
) -> list[tuple[str, int, bool, str | None, int]]:
    """Jobs and sessions that ended in [start, now], per node, hour, status and error
    code; those that cannot be evidence are left in the database."""
    provider_side = [code.value for code in PROVIDER_SIDE]
    found: list[tuple[str, int, bool, str | None, int]] = []
    for table, ended_at, good in (
        (InvokeRow, InvokeRow.finished_at, InvokeStatus.DONE.value),
        (SessionRow, SessionRow.closed_at, SessionStatus.CLOSED.value),
    ):
        hour = _hour(ended_at, dialect)
        rows = await session.execute(
            select(table.node_id, hour, table.status, table.error_code, func.count())
            .where(
                table.node_id.in_(ids),
                ended_at >= start,
                ended_at <= now,
                or_(table.status == good, table.error_code.in_(provider_side)),
            )
            .group_by(table.node_id, "hour", table.status, table.error_code)
        )
        found.extend(
            (str(node_id), step, status == good, code, count)
            for node_id, step, status, code, count in rows
        )
    return found


async def _benchmark_rows(
    session: AsyncSession, ids: list[str], start: datetime, now: datetime
) -> list[tuple[str, datetime, Any]]:
    """Runs in [start, now], and each node's first run (its baseline) when it is older."""
    run = BenchmarkRunRow
    first = (
        select(run.node_id, func.min(run.finished_at).label("at"))
        .where(run.node_id.in_(ids), run.finished_at < start)
        .group_by(run.node_id)
        .subquery()
    )
    recent = select(run.node_id, run.finished_at, run.scores).where(
        run.node_id.in_(ids), run.finished_at >= start, run.finished_at <= now
    )
    baseline = select(run.node_id, run.finished_at, run.scores).join(
        first, and_(run.node_id == first.c.node_id, run.finished_at == first.c.at)
    )
    rows = [*(await session.execute(baseline)), *(await session.execute(recent))]
    return [(r.node_id, r.finished_at, r.scores) for r in rows]


def benchmark_scores(scores: Any) -> dict[str, float]:
    """A run's scores per GPU uuid, or the node's (a CPU node, or no GPU scored)."""
    if not isinstance(scores, dict):
        return {}
    gpus = scores.get("gpus")
    if isinstance(gpus, dict):  # as in NodeRow.benchmark_state: by uuid
        entries = list(gpus.items())
    elif isinstance(gpus, list):  # as in BenchmarkRunRow.scores: verdicts naming their uuid
        entries = [(g.get("uuid"), g) for g in gpus if isinstance(g, dict)]
    else:
        entries = []
    found = {str(uuid): s for uuid, verdict in entries if (s := _score_of(verdict)) is not None}
    if not found and (s := _score_of(scores.get("node"))) is not None:
        found["node"] = s
    return found


def _score_of(verdict: Any) -> float | None:
    value = verdict.get("score") if isinstance(verdict, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass
class Published:
    nodes: dict[str, Reliability | None]
    providers: dict[str, Reliability | None]


async def compute_all(session: AsyncSession, now: datetime) -> Published:
    nodes = await node_facts(session)
    scores: dict[str, Reliability | None] = {}
    for i in range(0, len(nodes), _CHUNK):
        chunk = nodes[i : i + _CHUNK]
        records = await load_records(session, chunk, lookback_start(now), now)
        scores.update({n.id: score(records[n.id], now) for n in chunk})
    by_provider: defaultdict[str, list[Reliability]] = defaultdict(list)
    for node in nodes:
        if (found := scores[node.id]) is not None:
            by_provider[node.provider_id].append(found)
    provider_ids = (await session.scalars(select(ProviderRow.id).order_by(ProviderRow.id))).all()
    return Published(scores, {p: combine(by_provider.get(p, []), now) for p in provider_ids})


async def publish(session: AsyncSession, published: Published) -> None:
    """Store the scores. Rows are updated in one order (nodes by registration, then
    providers by id), so two replicas publishing at once queue rather than deadlock."""

    def dumped(value: Reliability | None) -> dict[str, Any] | None:
        return value.model_dump(mode="json") if value is not None else None

    if published.nodes:
        await session.execute(
            sql_update(NodeRow),
            [{"id": k, "reliability": dumped(v)} for k, v in published.nodes.items()],
        )
    if published.providers:
        await session.execute(
            sql_update(ProviderRow),
            [{"id": k, "reliability": dumped(v)} for k, v in published.providers.items()],
        )


async def refresh_all(session: AsyncSession, now: datetime) -> Published:
    """Recompute and store every node's and provider's score (the reliability loop)."""
    published = await compute_all(session, now)
    await publish(session, published)
    return published


async def compute_node(session: AsyncSession, node_id: str, now: datetime) -> Reliability | None:
    nodes = await node_facts(session, NodeRow.id == node_id)
    if not nodes:
        return None
    records = await load_records(session, nodes, lookback_start(now), now)
    return score(records[node_id], now)


async def compute_provider(
    session: AsyncSession, provider_id: str, now: datetime
) -> Reliability | None:
    nodes = await node_facts(session, NodeRow.provider_id == provider_id)
    records = await load_records(session, nodes, lookback_start(now), now)
    return combine([score(records[n.id], now) for n in nodes], now)


@dataclass(frozen=True)
class NodeHistory:
    node: NodeFacts
    current: Reliability
    points: list[ReliabilityPoint]  # the end of each recent day, then now


@dataclass(frozen=True)
class ProviderHistory:
    current: Reliability | None  # None: no node yet
    points: list[ReliabilityPoint]
    nodes: list[NodeHistory]


async def provider_history(
    session: AsyncSession, provider_id: str, now: datetime, days: int = 30
) -> ProviderHistory:
    """The provider's and each node's score now and at the end of each of the last days,
    recomputed from the stored evidence with the same formula (nothing extra is kept).

    The earliest day reaches back one lookback more: 59 days with the default, inside
    the 60 days presence is kept for."""
    nodes = await node_facts(session, NodeRow.provider_id == provider_id)
    if not nodes:
        return ProviderHistory(None, [], [])
    times = evaluation_times(nodes[0].registered_at, now, days)  # the oldest node's: all
    records = await load_records(session, nodes, lookback_start(times[0]), now)
    histories: list[NodeHistory] = []
    at_time: defaultdict[datetime, list[Reliability]] = defaultdict(list)
    for node in nodes:
        scored = series(records[node.id], now, days)
        node_times = evaluation_times(node.registered_at, now, days)
        for at, reliability in zip(node_times, scored, strict=True):
            at_time[at].append(reliability)
        points = [point(r, at) for at, r in zip(node_times, scored, strict=True)]
        histories.append(NodeHistory(node, scored[-1], points))
    combined = {at: combine(at_time[at], at) for at in times}
    return ProviderHistory(
        combined[now],
        [point(r, at) for at, r in combined.items() if r is not None],
        histories,
    )


async def published_for_provider(session: AsyncSession, provider_id: str) -> ProviderReliability:
    provider = await session.get(ProviderRow, provider_id)
    rows = await session.execute(
        select(NodeRow.id, NodeRow.hostname, NodeRow.label, NodeRow.reliability)
        .where(NodeRow.provider_id == provider_id)
        .order_by(NodeRow.registered_at, NodeRow.id)
    )
    return ProviderReliability(
        provider=stored_reliability(provider.reliability) if provider is not None else None,
        nodes=[
            NodeReliability(
                node_id=r.id,
                hostname=r.hostname,
                label=r.label,
                reliability=stored_reliability(r.reliability),
            )
            for r in rows
        ],
    )
