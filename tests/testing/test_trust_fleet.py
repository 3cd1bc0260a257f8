"""The trust bench's marketplace (`testing/trust_fleet`, `testing/trust_ticks`), small and
with every job checked: each kind of cheater is caught and made to pay back, fake
hardware fails its challenge and gets no work, honest nodes with noise are never
caught, and the books still balance."""

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.trust_fleet import STRATEGIES, FleetConfig, make_fleet, prove_hardware
from gpu_share.testing.trust_ticks import run_ticks


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.challenge_scale = 1e-7  # the same protocol, chains of kilobytes
    settings.challenge_memory_share = 0.5
    settings.challenge_target_sec = 0.05
    settings.spot_check_start_rate = 1.0  # every job checked: a catch takes one fake
    settings.spot_check_floor_rate = 1.0
    return settings


async def test_every_kind_of_cheater_is_caught_and_no_honest_node_is(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    config = FleetConfig(
        nodes=10, cheat_share=0.5, jobs=2, veterans=1, veteran_jobs=3, challenged=2,
        budget=3, turn_after=2, trusted=1, tenants=2, arrival_ticks=2,
    )  # fmt: skip
    fleet = await make_fleet(config, app, clock, client)
    assert sorted(n.kind for n in fleet.nodes if not n.honest) == sorted(STRATEGIES)
    await prove_hardware(fleet)
    await run_ticks(fleet)

    for node in fleet.nodes:
        if node.kind == "fake_hardware":
            assert node.agent.node_id in fleet.challenge_failures
            assert node.jobs == 0 and node.leased_unverified == 0
        elif node.honest:
            assert node.caught_jobs is None and node.jobs == node.limit
            assert node.agent.node_id not in fleet.challenge_failures
        else:
            assert node.caught_jobs is not None, node.kind
            assert 1 <= (node.caught_fabricated or 0) <= config.budget, node.kind
    async with fleet.replica.db.read() as session:
        rows = (await session.scalars(select(InvokeRow).where(InvokeRow.check_of.is_(None)))).all()
        quarantined = set(
            await session.scalars(select(NodeRow.id).where(NodeRow.quarantined_at.is_not(None)))
        )
        assert await ledger.books_total(session) == (0, 0)
    cheaters = {n.agent.node_id for n in fleet.nodes if not n.honest}
    assert quarantined == cheaters - set(fleet.challenge_failures)
    trusted = {agent.node_id for agent in fleet.trusted}  # they ran jobs requeued from rogues
    for row in rows:
        if row.node_id in cheaters:  # every job they served, honest or not, paid back
            assert row.refunded_at is not None, row.id
        else:
            assert row.refunded_at is None
            checked = "skipped" if row.node_id in trusted else "match"
            assert row.check_state in (checked, "inconclusive"), row.id
    assert fleet.fabricated_ids <= {r.id for r in rows if r.node_id in cheaters}
