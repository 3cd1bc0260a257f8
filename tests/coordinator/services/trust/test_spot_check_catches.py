"""Spot checks catching rogue nodes over the real protocol (docs/trust.md), on SQLite and
PostgreSQL: each way of cheating (fake outputs, a faked share, failures never had, a
record built then spent) is caught, and the whole path holds: quarantine, the tenant's
trusted result at no cost, refunds of every job within the hold, the forfeit, the mail,
the evidence for the admin, sessions ended with NODE_QUARANTINED, and a second offence
suspending the provider."""

import base64
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import (
    InvokeRow,
    LedgerTransactionRow,
    NodeRow,
    OutboxMailRow,
    ProviderRow,
    SessionRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.loops import earnings_hold as release_loop
from gpu_share.coordinator.loops import session_upkeep
from gpu_share.coordinator.loops.spot_checks import SpotCheckPass
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.coordinator.services.trust.consequences import forfeit_cause
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import OpenSession, SessionStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.rogue_agents import (
    FakeFailures,
    FakeOutputs,
    FakeShare,
    HonestThenFake,
)
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent
from gpu_share.testing.spot_checks import SpotCheckBench

TOP_UP = 100_000_000  # 100 USDC


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Every job checked: a catch takes one job, not a few tens."""
    settings.spot_check_start_rate = 1.0
    settings.spot_check_floor_rate = 1.0
    return settings


@pytest.fixture
async def bench(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> AsyncIterator[SpotCheckBench]:
    made = SpotCheckBench(app, client, clock, provider, sim_agent)
    yield made
    for agent in made.agents:
        await agent.aclose()


class AgentChannel:
    """The agent's end of a node's session channel: answers that the model is loaded,
    and keeps what the coordinator said."""

    def __init__(self, app: FastAPI) -> None:
        self.hub = app.state.replica.hub
        self.messages: list[dict[str, Any]] = []

    async def send_text(self, data: str) -> None:
        self.messages.append(json.loads(data))
        if self.messages[-1]["type"] == "open":
            self.hub.settle(OpenSession.model_validate_json(data).session_id, SessionStatus.READY)

    async def send_bytes(self, data: bytes) -> None:
        raise AssertionError("no forwards here")


def caught_in(passes: list[SpotCheckPass]) -> list[str]:
    return [c.caught.incident_id for p in passes for c in p.concluded if c.caught is not None]


async def until_caught(
    bench: SpotCheckBench,
    tenant: TenantHandle,
    rogue: SimulatedAgent,
    trusted: SimulatedAgent,
    behaviour: Any,
    *,
    most: int,
    per_round: int = 1,
) -> tuple[int, list[str]]:
    """Jobs for the rogue, checked round by round, until a check catches it: how many
    jobs it ran, and the incidents."""
    ran = 0
    while ran < most:
        await bench.submit(tenant, per_round)
        ran += len(await bench.run(rogue, behaviour))
        incidents = caught_in(await bench.check_round(trusted))
        if incidents:
            return ran, incidents
    raise AssertionError(f"not caught within {ran} jobs")


async def node_row(bench: SpotCheckBench, node_id: str | None) -> NodeRow:
    async with bench.replica.db.read() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        return row


async def invoke_rows(bench: SpotCheckBench, node_id: str | None) -> list[InvokeRow]:
    async with bench.replica.db.read() as session:
        query = select(InvokeRow).where(InvokeRow.node_id == node_id, InvokeRow.check_of.is_(None))
        return list((await session.scalars(query)).all())


async def balance(bench: SpotCheckBench, account: ledger.Account) -> int:
    async with bench.replica.db.read() as session:
        return await ledger.balance(session, account)


async def books_balance(bench: SpotCheckBench) -> None:
    async with bench.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)


async def test_a_node_faking_every_output_is_caught_and_the_whole_path_holds(
    app: FastAPI,
    bench: SpotCheckBench,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
) -> None:
    rogue, honest = await bench.node(), await bench.node()
    trusted = await bench.trusted_node()
    await bench.top_up(tenant)
    await bench.top_up(other_tenant)
    # An honest node of the same provider earns first: held earnings, later forfeited.
    await bench.submit(tenant)
    honest_jobs = await bench.run(honest)
    assert not caught_in(await bench.check_round(trusted))
    held_before = await balance(bench, ledger.provider_held(provider.id))
    assert held_before > 0

    # The rogue holds a session of the other tenant, billed as it goes.
    channel = AgentChannel(app)
    app.state.replica.hub.attach(rogue.node_id, channel)
    await rogue.heartbeat()
    opened = await client.post(
        "/v1/gpu/sessions",
        json={
            "runtime": "onnx_cuda",
            "model_url": HELLO_WORLD["model_url"],
            "idle_timeout_sec": 24 * 3600,
        },
        headers=other_tenant.headers,
    )
    assert opened.status_code == 201, opened.text
    session_id = opened.json()["id"]
    replica = app.state.replica
    sessions = Sessions(replica.db, replica.hub, replica.clock, replica.settings)
    assert rogue.node_id is not None
    await sessions.on_ready(rogue.node_id, session_id, "cuda", [])  # as its agent says
    clock.advance(3600)
    await session_upkeep.run_once(replica)
    assert await balance(bench, ledger.tenant_balance(other_tenant.id)) < TOP_UP

    jobs = await bench.submit(tenant, 2) + await bench.submit(other_tenant)
    assert sorted(await bench.run(rogue, FakeOutputs())) == sorted(jobs)
    passes = await bench.check_round(trusted)
    incidents = caught_in(passes)
    assert incidents

    # Quarantined: no new work, its session ended with NODE_QUARANTINED.
    node = await node_row(bench, rogue.node_id)
    assert node.quarantined_at is not None and incidents[0] in (node.quarantine_reason or "")
    (waiting,) = await bench.submit(tenant)
    assert await rogue.lease(slots=1) == []
    canceled = await client.post(f"/v1/gpu/invokes/{waiting}/cancel", headers=tenant.headers)
    assert canceled.status_code == 200, canceled.text
    await session_upkeep.run_once(app.state.replica)
    ended = await client.get(f"/v1/gpu/sessions/{session_id}", headers=other_tenant.headers)
    assert ended.json()["status"] == "failed", ended.text
    assert ended.json()["error"]["code"] == ErrorCode.NODE_QUARANTINED.value
    assert any(m["type"] == "close" for m in channel.messages)
    await bench.spot_pass()  # refunds what the session's last interval charged, if anything

    # The tenants got the trusted node's results, and every job of the node back.
    for invoke_id in jobs:
        seen = await client.get(
            f"/v1/gpu/invokes/{invoke_id}",
            headers=(tenant if invoke_id in jobs[:2] else other_tenant).headers,
        )
        body = seen.json()
        assert body["refund"] is not None and "caught" in body["refund"]["reason"]
    checked = [row for row in await invoke_rows(bench, rogue.node_id) if row.id in jobs]
    mismatched = [row for row in checked if row.check_state == CheckState.MISMATCH.value]
    assert mismatched
    for row in mismatched:
        outputs = base64.b64decode(row.result["outputs_inline_base64"])  # type: ignore[index]
        assert outputs, "the trusted node's outputs replaced the fake ones"
        assert row.status == "done" and row.refunded_at is not None
    assert await balance(bench, ledger.tenant_balance(other_tenant.id)) == TOP_UP
    async with bench.replica.db.read() as session:
        honest_rows = (
            await session.scalars(select(InvokeRow).where(InvokeRow.id.in_(honest_jobs)))
        ).all()
        honest_cost = sum(row.cost_micro or 0 for row in honest_rows)
        assert (await session.get(SessionRow, session_id)).status == "failed"  # type: ignore[union-attr]
    assert honest_cost > 0
    assert await balance(bench, ledger.tenant_balance(tenant.id)) == TOP_UP - honest_cost

    # The provider's held earnings went to the platform; the provider was mailed.
    assert await balance(bench, ledger.provider_held(provider.id)) == 0
    async with bench.replica.db.read() as session:
        forfeit = await session.scalar(
            select(LedgerTransactionRow).where(
                LedgerTransactionRow.cause == forfeit_cause(incidents[0])
            )
        )
        assert forfeit is not None and forfeit.kind == "forfeit"
        mails = (await session.scalars(select(OutboxMailRow))).all()
        owner = await session.get(ProviderRow, provider.id)
        assert owner is not None and owner.offences == 1 and owner.suspended_at is None
    mail = [m for m in mails if m.cause == f"trust:{incidents[0]}:caught"]
    assert mail and mail[0].to_address == owner.email and "quarantined" in mail[0].subject
    await books_balance(bench)

    # The admin sees the evidence; the provider sees the incident, not the tenant's job.
    listed = await client.get("/v1/admin/trust/incidents", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    first = next(i for i in listed.json() if i["id"] == incidents[0])
    detail = (await client.get(f"/v1/admin/trust/incidents/{first['id']}", headers=ADMIN)).json()
    evidence = detail["evidence"]
    caught_invoke = next(row for row in checked if row.id == detail["invoke_id"])
    assert evidence["model_sha256"] == caught_invoke.model_sha256
    assert evidence["inputs_sha256"] == caught_invoke.inputs_sha256
    assert evidence["node"]["result"]["outputs_inline_base64"]
    assert evidence["trusted"]["result"]["outputs_inline_base64"]
    assert evidence["node"]["result"] != evidence["trusted"]["result"]
    assert evidence["trusted"]["node_id"] == trusted.node_id
    assert "logits" in evidence["comparison"]["arrays"]
    assert detail["kind"] == "result_mismatch" and detail["refunded"] != "0"
    theirs = await client.get(
        "/v1/provider/trust/incidents", headers={"Authorization": f"Bearer {provider.key}"}
    )
    assert theirs.status_code == 200, theirs.text
    assert incidents[0] in [i["id"] for i in theirs.json()]
    assert all(i["evidence"] is None for i in theirs.json())


async def test_a_node_faking_a_tenth_of_its_jobs_is_caught(
    bench: SpotCheckBench, tenant: TenantHandle
) -> None:
    rogue, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    cheat = FakeShare(share=0.1, seed=7)
    ran, incidents = await until_caught(bench, tenant, rogue, trusted, cheat, most=80, per_round=5)
    assert cheat.faked >= 1 and incidents
    assert (await node_row(bench, rogue.node_id)).quarantined_at is not None
    # Every job it ran within the hold is refunded, the honest ones too.
    rows = await invoke_rows(bench, rogue.node_id)
    assert len([r for r in rows if r.refunded_at is not None]) == ran
    assert await balance(bench, ledger.tenant_balance(tenant.id)) == TOP_UP
    await books_balance(bench)


@pytest.mark.parametrize("code", [ErrorCode.RUNTIME_ERROR, ErrorCode.TIMEOUT])
async def test_a_node_reporting_failures_it_never_had_is_caught(
    bench: SpotCheckBench, client: httpx.AsyncClient, tenant: TenantHandle, code: ErrorCode
) -> None:
    rogue, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant)
    await bench.run(rogue, FakeFailures(code, after_ms=2000), seconds=2)
    before = await client.get(f"/v1/gpu/invokes/{job}", headers=tenant.headers)
    assert before.json()["error"]["code"] == code.value and before.json()["cost"] != "0"
    incidents = caught_in(await bench.check_round(trusted))
    assert incidents
    detail = (await client.get(f"/v1/admin/trust/incidents/{incidents[0]}", headers=ADMIN)).json()
    assert detail["kind"] == "failure_not_reproduced" and detail["invoke_id"] == job
    after = (await client.get(f"/v1/gpu/invokes/{job}", headers=tenant.headers)).json()
    assert after["status"] == "done" and after["error"] is None and after["result"] is not None
    assert after["refund"] is not None and after["spot_checked"] is True
    assert await balance(bench, ledger.tenant_balance(tenant.id)) == TOP_UP
    await books_balance(bench)


async def test_a_node_that_turns_to_cheating_is_caught_and_a_second_offence_suspends(
    bench: SpotCheckBench, provider: ProviderHandle, tenant: TenantHandle, clock: FrozenClock
) -> None:
    first, second, bystander = await bench.node(), await bench.node(), await bench.node()
    trusted = await bench.trusted_node()
    await bench.top_up(tenant)
    # A job of the first node older than the hold: payable by now, not taken back.
    (old,) = await bench.submit(tenant)
    await bench.run(first)
    await bench.check_round(trusted)
    clock.advance(timedelta(days=8).total_seconds())
    await release_loop.run_once(bench.replica)
    paid = await balance(bench, ledger.provider_pending(provider.id))
    assert paid > 0

    ran, _ = await until_caught(
        bench, tenant, first, trusted, HonestThenFake(honest_jobs=5), most=20
    )
    assert ran == 6  # five clean checks, caught at the first fake
    rows = await invoke_rows(bench, first.node_id)
    refunded = {r.id for r in rows if r.refunded_at is not None}
    assert old not in refunded and len(refunded) == ran
    assert await balance(bench, ledger.provider_pending(provider.id)) == paid
    async with bench.replica.db.read() as session:
        owner = await session.get(ProviderRow, provider.id)
        assert owner is not None and owner.offences == 1 and owner.suspended_at is None
    assert (await node_row(bench, bystander.node_id)).quarantined_at is None

    _, again = await until_caught(
        bench, tenant, second, trusted, HonestThenFake(honest_jobs=2), most=20
    )
    async with bench.replica.db.read() as session:
        owner = await session.get(ProviderRow, provider.id)
        assert owner is not None and owner.offences == 2 and owner.suspended_at is not None
        mail = await session.scalar(
            select(OutboxMailRow).where(OutboxMailRow.cause == f"trust:{again[0]}:caught")
        )
    assert mail is not None and "suspended" in mail.body
    for agent in (first, second, bystander):
        assert (await node_row(bench, agent.node_id)).quarantined_at is not None
    await bench.submit(tenant)
    assert await bystander.lease(slots=1) == []
    await books_balance(bench)


async def test_a_catboost_node_returning_a_made_up_model_is_caught(
    bench: SpotCheckBench, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    rogue, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant, runtime="catboost_cuda")
    await bench.run(rogue, FakeOutputs())
    incidents = caught_in(await bench.check_round(trusted))
    assert incidents
    detail = (await client.get(f"/v1/admin/trust/incidents/{incidents[0]}", headers=ADMIN)).json()
    assert "RMSE" in detail["reason"]
    after = (await client.get(f"/v1/gpu/invokes/{job}", headers=tenant.headers)).json()
    assert after["refund"] is not None
    outputs = base64.b64decode(after["result"]["outputs_inline_base64"])
    assert b"evaluation_json" in outputs  # the trusted node's training, with its scoring
