"""The published reliability score (SPEC §3.7) on real databases: presence, invokes,
sessions and benchmark runs inserted through the ORM; `refresh_all` stores on every node
and provider exactly what the pure formula makes of the same evidence."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import insert, update

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import (
    BenchmarkRunRow,
    InvokeRow,
    NodePresenceRow,
    NodeRow,
    ProviderRow,
    SessionRow,
)
from gpu_share.coordinator.loops import reliability as reliability_loop
from gpu_share.coordinator.services.nodes.presence import bucket_of
from gpu_share.coordinator.services.providers import reliability
from gpu_share.coordinator.services.providers.reliability import benchmark_scores
from gpu_share.coordinator.services.providers.reliability_formula import (
    NOT_JOB_OUTCOMES,
    PROVIDER_SIDE,
    TENANT_SIDE,
    BenchmarkScores,
    JobOutcome,
    combine,
    record_from_buckets,
    score,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.reliability import Reliability
from gpu_share.protocol.schedules import Availability
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory

WORKDAYS = {
    "always": False,
    "timezone": "Europe/Berlin",
    "windows": [{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", "end": "17:00"}],
}
FIVE_MINUTES = timedelta(minutes=5)


@pytest.fixture
def db(app: FastAPI) -> Database:
    database: Database = app.state.replica.db
    return database


def buckets(start: datetime, end: datetime) -> list[datetime]:
    found, at = [], bucket_of(start)
    while at < end:
        found.append(at)
        at += FIVE_MINUTES
    return found


async def set_node(db: Database, node_id: str | None, **values: Any) -> None:
    async with db.write() as session:
        await session.execute(update(NodeRow).where(NodeRow.id == node_id).values(**values))


async def add_presence(db: Database, node_id: str | None, present: Sequence[datetime]) -> None:
    async with db.write() as session:
        await session.execute(
            insert(NodePresenceRow),
            [{"node_id": node_id, "bucket_start": b, "beats": 12} for b in present],
        )


async def add_invoke(
    db: Database, tenant_id: str, node_id: str | None, finished_at: datetime, error: str | None
) -> None:
    status = "done" if error is None else ("timeout" if error == "TIMEOUT" else "failed")
    async with db.write() as session:
        session.add(
            InvokeRow(
                id=new_id("inv"),
                tenant_id=tenant_id,
                status="canceled" if error == "CANCELED" else status,
                runtime="onnx_cpu",
                priority="normal",
                model_url="https://example.com/m.onnx",
                inputs_url="",
                timeout_sec=60,
                gpus=0,
                constraints={},
                warnings=[],
                attempts=1,
                max_attempts=3,
                node_id=node_id,
                created_at=finished_at - timedelta(minutes=1),
                finished_at=finished_at,
                error_code=error,
                log_bytes=0,
            )
        )


async def add_session(
    db: Database, tenant_id: str, node_id: str | None, closed_at: datetime, error: str | None
) -> None:
    async with db.write() as session:
        session.add(
            SessionRow(
                id=new_id("ses"),
                tenant_id=tenant_id,
                node_id=node_id,
                status="closed" if error is None else "failed",
                runtime="onnx_cpu",
                model_url="https://example.com/m.onnx",
                idle_timeout_sec=300,
                max_concurrency=1,
                reserved_mb=0,
                created_at=closed_at - timedelta(hours=1),
                touched_at=closed_at,
                closed_at=closed_at,
                forward_count=0,
                error_code=error,
            )
        )


def run_scores(
    gpu_scores: dict[str, float] | None = None, node: float | None = None
) -> dict[str, Any]:
    """`BenchmarkRunRow.scores` as the benchmark service writes it."""
    return {
        "tier": "community",
        "passed": True,
        "reason": None,
        "gpus": [
            {"uuid": u, "index": i, "score": s, "passed": True}
            for i, (u, s) in enumerate((gpu_scores or {}).items())
        ],
        "node": {"score": node, "passed": node is not None},
    }


async def add_run(
    db: Database, node_id: str | None, finished_at: datetime, scores: dict[str, Any]
) -> None:
    async with db.write() as session:
        session.add(
            BenchmarkRunRow(
                id=new_id("bench"),
                node_id=node_id,
                trigger="periodic",
                started_at=finished_at - timedelta(minutes=2),
                finished_at=finished_at,
                report={},
                scores=scores,
                passed=True,
            )
        )


async def published(app: FastAPI, node_id: str | None) -> dict[str, Any] | None:
    async with app.state.replica.db.read() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        stored: dict[str, Any] | None = row.reliability
        return stored


def without_exact_times(value: Reliability | dict[str, Any] | None) -> dict[str, Any]:
    """Outcomes are stored per hour, so the last failure is known to the hour."""
    dumped = value.model_dump(mode="json") if isinstance(value, Reliability) else dict(value or {})
    dumped["completion_evidence"] = {
        k: v for k, v in dumped["completion_evidence"].items() if k != "last_failure_at"
    }
    return dumped


async def test_refresh_all_publishes_what_the_formula_makes_of_the_stored_evidence(
    app: FastAPI,
    db: Database,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    now = clock.now()
    always, workdays = await sim_agent(), await sim_agent()
    registered = now - timedelta(days=40)
    for agent in (always, workdays):
        await set_node(db, agent.node_id, registered_at=registered)
    await set_node(db, workdays.node_id, availability=WORKDAYS)

    # Around the clock for 35 days (5 of them past the lookback), but for 6 hours two
    # days ago; the bucket now running does not count yet.
    outage = (now - timedelta(days=2), now - timedelta(days=2) + timedelta(hours=6))
    present = [
        b
        for b in buckets(now - timedelta(days=35), now + FIVE_MINUTES)
        if not outage[0] <= b < outage[1]
    ]
    await add_presence(db, always.node_id, present)
    # The workdays machine: on every third day only, inside and outside its hours.
    sometimes = [b for b in buckets(now - timedelta(days=20), now) if (now - b).days % 3 == 0]
    await add_presence(db, workdays.node_id, sometimes)

    outcomes = [
        (now - timedelta(days=1, minutes=7), None),
        (now - timedelta(days=3, minutes=45), "LEASE_EXPIRED"),
        (now - timedelta(days=12), "INVALID_MODEL"),  # the tenant's: not counted
        (now - timedelta(days=40), "AGENT_ERROR"),  # past the lookback
        (now - timedelta(hours=2), None),
    ]
    for at, error in outcomes:
        await add_invoke(db, tenant.id, always.node_id, at, error)
    await add_session(db, tenant.id, always.node_id, now - timedelta(hours=5), "NODE_LOST")
    await add_session(db, tenant.id, always.node_id, now - timedelta(hours=9), None)
    await add_session(db, tenant.id, always.node_id, now - timedelta(hours=9), "INVALID_INPUTS")
    runs = [
        (now - timedelta(days=39), run_scores({"GPU-a": 0.9, "GPU-b": 0.8})),  # the first
        (now - timedelta(days=8), run_scores({"GPU-a": 0.88, "GPU-b": 0.6})),
        (now - timedelta(days=1), run_scores({"GPU-a": 0.9, "GPU-b": 0.79})),
    ]
    for at, scores in runs:
        await add_run(db, always.node_id, at, scores)
    await add_run(db, workdays.node_id, now - timedelta(days=3), run_scores(node=0.7))

    async with app.state.replica.db.write() as session:
        result = await reliability.refresh_all(session, now)

    counted = [
        JobOutcome(at, error is not None)
        for at, error in [
            *outcomes,
            (now - timedelta(hours=5), "NODE_LOST"),
            (now - timedelta(hours=9), None),
        ]
        if error is None or ErrorCode(error) in PROVIDER_SIDE
    ]
    expected_always = score(
        record_from_buckets(
            registered,
            Availability(),
            present,
            now,
            counted,
            [BenchmarkScores(at, benchmark_scores(s)) for at, s in runs],
        ),
        now,
    )
    expected_workdays = score(
        record_from_buckets(
            registered,
            Availability.model_validate(WORKDAYS),
            sometimes,
            now,
            benchmarks=[BenchmarkScores(now - timedelta(days=3), {"node": 0.7})],
        ),
        now,
    )
    assert without_exact_times(await published(app, always.node_id)) == without_exact_times(
        expected_always
    )
    assert await published(app, workdays.node_id) == expected_workdays.model_dump(mode="json")

    stored = Reliability.model_validate(await published(app, always.node_id))
    assert stored.completion_evidence.jobs_counted == 5  # 3 done or closed, 2 lost
    assert stored.completion_evidence.provider_failures == 2
    assert stored.stability_evidence.runs_counted == 2  # the first run is past the lookback
    assert (
        stored.stability_evidence.worst_drop is not None
        and stored.stability_evidence.worst_drop > 0.1
    )
    assert 0 < stored.uptime_evidence.hours_online < stored.uptime_evidence.hours_in_windows
    hours = Reliability.model_validate(await published(app, workdays.node_id)).uptime_evidence
    assert hours.hours_in_windows <= 30 / 7 * 5 * 8 + 8  # only the declared hours

    provider_score = combine([expected_always, expected_workdays], now)
    async with app.state.replica.db.read() as session:
        row = await session.get(ProviderRow, provider.id)
        assert row is not None
        assert without_exact_times(row.reliability) == without_exact_times(provider_score)
    assert result.providers[provider.id] is not None


async def test_a_tenant_side_failure_changes_nothing_and_a_provider_side_one_counts(
    app: FastAPI, db: Database, tenant: TenantHandle, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    agent = await sim_agent()
    now = clock.now()
    await set_node(db, agent.node_id, registered_at=now - timedelta(days=9))
    await add_presence(db, agent.node_id, buckets(now - timedelta(days=9), now))
    await add_invoke(db, tenant.id, agent.node_id, now - timedelta(days=1), None)

    async def current() -> Reliability:
        async with app.state.replica.db.read() as session:
            found = await reliability.compute_node(session, str(agent.node_id), now)
        assert found is not None
        return found

    before = await current()
    for code in sorted(TENANT_SIDE):
        await add_invoke(db, tenant.id, agent.node_id, now - timedelta(hours=3), code.value)
        await add_session(db, tenant.id, agent.node_id, now - timedelta(hours=3), code.value)
    assert await current() == before
    await add_invoke(db, tenant.id, agent.node_id, now - timedelta(hours=3), "AGENT_ERROR")
    after = await current()
    assert after.completion < before.completion and after.score < before.score
    assert after.uptime == before.uptime


def test_every_error_code_is_sorted_once_as_provider_side_tenant_side_or_neither() -> None:
    assert {
        ErrorCode.LEASE_EXPIRED,
        ErrorCode.NODE_LOST,
        ErrorCode.AGENT_ERROR,
        ErrorCode.NODE_QUARANTINED,
    } == PROVIDER_SIDE
    assert not PROVIDER_SIDE & TENANT_SIDE
    assert set(ErrorCode) == PROVIDER_SIDE | TENANT_SIDE | NOT_JOB_OUTCOMES
    assert {ErrorCode.TIMEOUT, ErrorCode.CANCELED, ErrorCode.INVALID_MODEL} <= TENANT_SIDE


async def test_a_provider_without_nodes_has_no_score_and_the_api_shows_the_published_one(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    headers = {"Authorization": f"Bearer {provider.key}"}
    empty = await client.get("/v1/provider/reliability", headers=headers)
    assert empty.status_code == 200 and empty.json() == {"provider": None, "nodes": []}

    agent = await sim_agent()
    await agent.heartbeat()
    started = (await client.get("/v1/provider/reliability", headers=headers)).json()
    assert [n["node_id"] for n in started["nodes"]] == [agent.node_id]
    first = started["nodes"][0]["reliability"]  # published at registration: where it starts
    assert (first["score"], first["start"]) == (0.9, 0.9)  # its provider had no score yet
    assert first["uptime_evidence"]["hours_in_windows"] == 0
    assert started["provider"] is None  # until the loop combines its nodes

    await reliability_loop.run_once(app.state.replica)  # what the loop does every minute
    body = (await client.get("/v1/provider/reliability", headers=headers)).json()
    node = body["nodes"][0]["reliability"]
    assert node["score"] == 0.9  # brand new: the neutral start
    assert set(node) >= {
        "score",
        "uptime",
        "completion",
        "stability",
        "uptime_evidence",
        "completion_evidence",
        "stability_evidence",
        "half_life_days",
        "computed_at",
    }
    assert body["provider"]["nodes"] == 1 and body["provider"]["score"] == node["score"]
    listed = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert [n["reliability"]["score"] for n in listed] == [0.9]  # tenants see the same

    assert (await client.get("/v1/provider/reliability", headers=tenant.headers)).status_code == 403
    assert (await client.get("/v1/provider/reliability")).status_code == 401
    admin = await client.get("/v1/provider/reliability", headers=ADMIN)
    assert admin.status_code == 403

    clock.advance(3600)
    async with app.state.replica.db.write() as session:
        again = await reliability.refresh_all(session, clock.now())
    assert again.providers[provider.id] is not None
    async with app.state.replica.db.read() as session:
        assert await reliability.compute_node(session, "nod_" + "0" * 26, clock.now()) is None
        assert await reliability.compute_provider(session, provider.id, clock.now()) is not None


async def test_a_benchmark_baseline_older_than_the_lookback_is_still_the_first_run(
    app: FastAPI, db: Database, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    agent = await sim_agent()
    now = clock.now()
    await set_node(db, agent.node_id, registered_at=now - timedelta(days=90))
    await add_run(db, agent.node_id, now - timedelta(days=80), run_scores({"GPU-a": 1.0}))
    await add_run(db, agent.node_id, now - timedelta(days=60), run_scores({"GPU-a": 0.2}))
    await add_run(db, agent.node_id, now - timedelta(days=2), run_scores({"GPU-a": 0.5}))
    async with app.state.replica.db.read() as session:
        found = await reliability.compute_node(session, str(agent.node_id), now)
    assert found is not None
    evidence = found.stability_evidence
    assert evidence.runs_counted == 1
    assert evidence.baseline_at is not None and evidence.baseline_at < now - timedelta(days=79)
    assert (
        evidence.latest_drop is not None and abs(evidence.latest_drop - (0.5 - 0.05) / 0.95) < 1e-3
    )
