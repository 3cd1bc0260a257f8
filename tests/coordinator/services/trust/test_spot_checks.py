"""Spot checks as the platform runs them (docs/trust.md, "Spot checks"), on SQLite and
PostgreSQL: a check only ever runs on a trusted node other than the job's own, costs
nobody anything and is never the tenant's to see; trusted nodes are not checked; a
check no trusted node takes is dropped as inconclusive; honest nodes with the noise of
real hardware are never caught; outputs stored as artifacts are compared like inline
ones; the rate falls with matches to its floor."""

from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.services.trust import spot_checks
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from gpu_share.testing.rogue_agents import Honest
from gpu_share.testing.simulated_agent import AgentFactory
from gpu_share.testing.spot_checks import SpotCheckBench


@pytest.fixture
def settings(settings: Settings) -> Settings:
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


async def rows(bench: SpotCheckBench, *, checks: bool) -> list[InvokeRow]:
    async with bench.replica.db.read() as session:
        which = InvokeRow.check_of.is_not(None) if checks else InvokeRow.check_of.is_(None)
        return list((await session.scalars(select(InvokeRow).where(which))).all())


async def test_a_check_never_lands_on_the_original_node_or_an_untrusted_one(
    bench: SpotCheckBench, tenant: TenantHandle
) -> None:
    worker, stranger = await bench.node(), await bench.node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant)
    assert await bench.run(worker) == [job]
    assert (await bench.spot_pass()).picked == 1
    (check,) = await rows(bench, checks=True)
    assert check.check_of == job and check.status == "queued" and check.priority == "spot"
    assert check.outputs_upload is None and check.reserved_micro == 0
    assert await stranger.lease(slots=1) == []  # not trusted
    await bench.mark(worker, trusted=True)
    assert await worker.lease(slots=1) == []  # trusted now, but the job was its own
    trusted = await bench.trusted_node()
    assert await bench.run(trusted) == [check.id]
    (ran,) = await rows(bench, checks=True)
    assert ran.node_id == trusted.node_id and ran.cost_micro == 0 and ran.rate_micro_per_hour == 0
    await bench.spot_pass()
    (original,) = await rows(bench, checks=False)
    assert original.check_state == CheckState.MATCH.value


async def test_a_tenant_never_sees_the_checks_of_their_jobs(
    bench: SpotCheckBench, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    worker, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant)
    await bench.run(worker)
    await bench.check_round(trusted)
    (check,) = await rows(bench, checks=True)
    listed = await client.get("/v1/gpu/invokes", headers=tenant.headers)
    assert [i["id"] for i in listed.json()["items"]] == [job], listed.text
    for path in (f"/v1/gpu/invokes/{check.id}", f"/v1/gpu/invokes/{check.id}/logs"):
        hidden = await client.get(path, headers=tenant.headers)
        assert hidden.status_code == 404, hidden.text
    canceled = await client.post(f"/v1/gpu/invokes/{check.id}/cancel", headers=tenant.headers)
    assert canceled.status_code == 404
    seen = (await client.get(f"/v1/gpu/invokes/{job}", headers=tenant.headers)).json()
    assert seen["spot_checked"] is True and seen["refund"] is None


async def test_trusted_nodes_run_checks_and_are_never_checked_themselves(
    bench: SpotCheckBench, tenant: TenantHandle
) -> None:
    trusted = await bench.trusted_node()
    await bench.top_up(tenant)
    (job,) = await bench.submit(tenant)
    assert await bench.run(trusted) == [job]
    assert (await bench.spot_pass()).picked == 0
    (row,) = await rows(bench, checks=False)
    assert row.check_state == CheckState.SKIPPED.value
    assert await rows(bench, checks=True) == []


async def test_a_check_no_trusted_node_takes_is_dropped_as_inconclusive(
    bench: SpotCheckBench, tenant: TenantHandle, clock: FrozenClock
) -> None:
    worker = await bench.node()
    await bench.top_up(tenant)
    await bench.submit(tenant)
    await bench.run(worker)
    await bench.spot_pass()
    async with bench.replica.db.read() as session:
        assert await spot_checks.waiting(session) == 1
    clock.advance(bench.replica.settings.spot_check_wait_sec + 1)
    done = await bench.spot_pass()
    assert done.dropped == 1 and [c.state for c in done.concluded] == ["inconclusive"]
    (row,) = await rows(bench, checks=False)
    assert row.check_state == CheckState.INCONCLUSIVE.value
    async with bench.replica.db.read() as session:
        assert await spot_checks.waiting(session) == 0
        node = await session.get(NodeRow, worker.node_id)
    assert node is not None and node.quarantined_at is None
    assert (
        node.spot_checks is not None
        and node.spot_checks["runtimes"]["onnx_cuda"]["inconclusive"] == 1
    )


@pytest.mark.parametrize("noise", [4 * 1.2e-7, 1e-3])  # a few float32 ulps; TF32 products
async def test_honest_nodes_with_hardware_noise_are_never_caught(
    bench: SpotCheckBench, tenant: TenantHandle, noise: float
) -> None:
    nodes = [await bench.node(), await bench.node()]
    trusted = await bench.trusted_node()
    await bench.top_up(tenant)
    for n in range(12):
        for k, node in enumerate(nodes):
            await bench.submit(tenant)
            await bench.run(node, Honest(noise=noise, seed=100 * n + k))
        passes = await bench.check_round(trusted, Honest(noise=noise, seed=7 + n))
        assert not [c for p in passes for c in p.concluded if c.caught is not None]
    states = [row.check_state for row in await rows(bench, checks=False)]
    assert len(states) == 24 and CheckState.MISMATCH.value not in states
    assert states.count(CheckState.MATCH.value) >= 20
    async with bench.replica.db.read() as session:
        for node in nodes:
            row = await session.get(NodeRow, node.node_id)
            assert row is not None and row.quarantined_at is None
            assert row.spot_checks is not None and row.spot_checks["mismatched"] == 0


@pytest.mark.parametrize("runtime", ["onnx_cuda", "catboost_cuda"])
async def test_outputs_stored_as_artifacts_are_compared_like_inline_ones(
    bench: SpotCheckBench, tenant: TenantHandle, runtime: str
) -> None:
    worker, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    await bench.submit(tenant, runtime=runtime)
    await bench.run(worker, Honest(stores_with=worker.client))
    (row,) = await rows(bench, checks=False)
    assert row.result is not None and row.result["outputs_url"]
    await bench.check_round(trusted, Honest(stores_with=trusted.client))
    (row,) = await rows(bench, checks=False)
    assert row.check_state == CheckState.MATCH.value


async def test_the_rate_falls_with_matches_to_its_floor(
    bench: SpotCheckBench, tenant: TenantHandle
) -> None:
    settings = bench.replica.settings
    settings.spot_check_start_rate, settings.spot_check_floor_rate = 0.5, 0.03
    settings.spot_check_halving_matches = 2
    worker, trusted = await bench.node(), await bench.trusted_node()
    await bench.top_up(tenant)
    rates = []
    for _ in range(12):
        (job,) = await bench.submit(tenant)
        await bench.run(worker)
        async with bench.replica.db.write() as session:
            await spot_checks.decide(session, job, bench.clock.now(), settings, draw=0.0)
        await bench.check_round(trusted)
        async with bench.replica.db.read() as session:
            node = await session.get(NodeRow, worker.node_id)
            assert node is not None and node.spot_checks is not None
            rates.append(node.spot_checks["rate"])
    assert rates[:6] == [0.5, 0.25, 0.25, 0.125, 0.125, 0.0625]
    assert rates[-1] == 0.03 and rates == sorted(rates, reverse=True)
    # Drawn above the rate: not checked, and it says so.
    (job,) = await bench.submit(tenant)
    await bench.run(worker)
    async with bench.replica.db.write() as session:
        made = await spot_checks.decide(session, job, bench.clock.now(), settings, draw=0.031)
        assert made is None
        assert (await session.get(InvokeRow, job)).check_state == "skipped"  # type: ignore[union-attr]


async def test_a_pass_decides_its_invokes_together_each_once_by_its_own_draw(
    bench: SpotCheckBench, tenant: TenantHandle
) -> None:
    settings = bench.replica.settings
    settings.spot_check_start_rate, settings.spot_check_floor_rate = 0.5, 0.03
    first, second = await bench.node(), await bench.node()
    await bench.top_up(tenant)
    on_first = await bench.submit(tenant, count=3)
    assert await bench.run(first) == on_first
    on_second = await bench.submit(tenant, count=2)
    assert await bench.run(second) == on_second
    picked = {on_first[0], on_first[2], on_second[1]}  # drawn under the rate of 0.5
    draws = {job: 0.0 if job in picked else 0.9 for job in on_first + on_second}
    now = bench.clock.now()
    async with bench.replica.db.write() as session:
        made = await spot_checks.decide_all(session, list(draws), now, settings, draws=draws)
    assert {check.check_of for check in made} == picked
    originals = {row.id: row.check_state for row in await rows(bench, checks=False)}
    assert originals == {job: "pending" if job in picked else "skipped" for job in draws}
    async with bench.replica.db.write() as session:  # decided already: nothing happens
        assert await spot_checks.decide_all(session, list(draws), now, settings) == []
    async with bench.replica.db.read() as session:
        for node, decided, checked in ((first, 3, 2), (second, 2, 1)):
            row = await session.get(NodeRow, node.node_id)
            assert row is not None and row.spot_checks is not None
            record = row.spot_checks["runtimes"]["onnx_cuda"]
            assert (record["decided"], record["checked"]) == (decided, checked), record
    assert len(await rows(bench, checks=True)) == 3


async def test_the_admin_marks_and_unmarks_a_trusted_node(
    bench: SpotCheckBench, client: httpx.AsyncClient
) -> None:
    node = await bench.node()
    marked = await bench.mark(node, trusted=True)
    assert marked["marked_trusted"] is True and marked["trusted"] is True
    unmarked = await bench.mark(node, trusted=False)
    assert unmarked["trusted"] is False
    missing = await client.post(
        "/v1/admin/nodes/nod_00000000000000000000000000/trusted",
        json={"trusted": True},
        headers=ADMIN,
    )
    assert missing.status_code == 404
    refused = await client.post(
        f"/v1/admin/nodes/{node.node_id}/trusted",
        json={"trusted": True},
        headers={"Authorization": f"Bearer {bench.provider.key}"},
    )
    assert refused.status_code == 403
    assert timedelta(0) == timedelta(0)
