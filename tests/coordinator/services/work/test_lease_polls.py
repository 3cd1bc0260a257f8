"""The lease long-poll (`services/work/lease_polls.py`): woken as soon as work is queued;
an idle poll claims once and then only reads whether anything is queued; queued work it
could not take is claimed again each `max_wait`; a claim whose turn comes after the
agent gave up leases nothing."""

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.services.work import lease_polls
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from tests.coordinator.services.work.test_leases import CPU_HELLO, status_of, submit


async def test_a_long_poll_returns_as_soon_as_work_is_queued(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    waiting = asyncio.create_task(agent.lease(wait=25))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    invoke_id = await submit(client, tenant)
    # Far below the 25 s wait: only a wake-up can answer this fast.
    jobs = await asyncio.wait_for(waiting, timeout=10)
    assert [j.invoke_id for j in jobs] == [invoke_id]


def _claims_made() -> float:
    return metrics.EVENTS.get_sample_value("gpushare_claim_seconds_count") or 0.0


async def test_an_idle_long_poll_claims_once_then_rechecks_with_a_read(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    # Back from `max_wait` with no wake-up and nothing queued anywhere, a poll reads
    # whether anything is queued instead of claiming again (an idle fleet's cost).
    agent = await sim_agent()
    app.state.replica.notifier.max_wait = 0.05
    before = _claims_made()
    assert await agent.lease(wait=0.5) == []
    assert _claims_made() - before == 1


async def test_a_long_poll_claims_again_while_work_it_cannot_take_is_queued(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    # Queued work may become this node's with no wake-up (a rival's grace runs out, a
    # reservation window opens), so while anything is queued each `max_wait` claims.
    agent = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[H100]))
    await submit(client, tenant, {**HELLO_WORLD, "runtime": "onnx_cuda"})
    app.state.replica.notifier.max_wait = 0.05
    before = _claims_made()
    assert await agent.lease(wait=0.5, free_gpus=0) == []  # its one GPU is busy
    assert _claims_made() - before >= 4


async def test_a_claim_whose_turn_comes_after_the_agent_gave_up_leases_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Claims queue for the gate under load; one that could only start well past its
    # poll's wait is skipped, or the job would wait on an agent that stopped listening.
    monkeypatch.setattr(lease_polls, "LATE_CLAIM_SEC", 0.2)
    agent = await sim_agent()
    invoke_id = await submit(client, tenant, CPU_HELLO)
    gate = app.state.replica.claim_gate
    held = [await gate.acquire() for _ in range(app.state.replica.settings.claims_at_once)]
    polling = asyncio.create_task(agent.lease(wait=0))
    await asyncio.sleep(0.5)  # all claims busy, past the poll's deadline and the slack
    for _ in held:
        gate.release()
    assert await polling == []
    assert (await status_of(client, tenant, invoke_id))["status"] == "queued"
    assert [j.invoke_id for j in await agent.lease(wait=0)] == [invoke_id]


async def _polling(agents: list[SimulatedAgent]) -> list[asyncio.Task[list[wire.LeasedJob]]]:
    """Each agent in a long-poll, its first claim made (it marks the node as waiting)."""
    before = _claims_made()
    polls = [asyncio.create_task(agent.lease(wait=20)) for agent in agents]
    for _ in range(200):
        if _claims_made() - before >= len(agents):
            return polls
        await asyncio.sleep(0.02)
    raise AssertionError("the polls never made their first claims")


async def test_a_wake_up_that_finds_nothing_queued_costs_a_few_claims_not_one_a_poll(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    # One publish wakes every poll waiting here. Once a claim has found nothing queued
    # at all since, the others go back to waiting without one: at most the claims
    # already let through the gate run (an idle fleet paid a claim per node per submit).
    agents = [await sim_agent() for _ in range(12)]
    polls = await _polling(agents)
    notifier = app.state.replica.notifier
    before = _claims_made()
    await notifier.publish(Channel.WORK)  # a job another node took already, say
    await asyncio.sleep(1.0)
    assert 1 <= _claims_made() - before <= app.state.replica.settings.claims_at_once
    assert not any(poll.done() for poll in polls)

    # Work queued after that wakes them again, and one of them gets it.
    invoke_id = await submit(client, tenant, CPU_HELLO)
    done, _ = await asyncio.wait(polls, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert [j.invoke_id for poll in done for j in poll.result()] == [invoke_id]
    for poll in polls:
        poll.cancel()


async def test_work_whose_wake_up_was_lost_is_still_claimed_after_max_wait(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A wake-up found nothing queued, then work came whose wake-up never arrived (a
    # NOTIFY lost between replicas): back from `max_wait`, the poll claims it, though no
    # publish moved the version since the queue was seen empty.
    agent = await sim_agent()
    notifier = app.state.replica.notifier
    notifier.max_wait = 0.2
    polling = (await _polling([agent]))[0]
    await notifier.publish(Channel.WORK)
    await asyncio.sleep(0.3)  # woken, claimed, found nothing queued: settled
    assert notifier.settled(Channel.WORK, notifier.version(Channel.WORK))
    monkeypatch.setattr(notifier, "told_by_commit", lambda *_: None)  # the wake-up is lost
    invoke_id = await submit(client, tenant, CPU_HELLO)
    jobs = await asyncio.wait_for(polling, timeout=10)
    assert [j.invoke_id for j in jobs] == [invoke_id]
