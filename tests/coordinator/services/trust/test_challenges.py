"""Hardware challenges on the coordinator (docs/trust.md): an honest node's GPU (or CPU)
becomes verified in the documented shape and is challenged again days later; late,
made-up, tampered or missing answers fail; a node only ever reaches its own challenges;
an inventory change challenges the changed GPU again at once."""

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import ChallengeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import challenges as challenge_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.trust import ChallengeStatus
from gpu_share.testing.challenge_answers import ChallengeAnswer
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory

DEADLINE_SEC = 30 + 4 / 0.2  # the default allowance + target ÷ efficiency floor
UNKNOWN_CARD = GpuInfo(index=0, uuid="GPU-odd-0001", model="NVIDIA Quadro Odd", vram_mb=8192)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Challenges shrunk to a few kilobytes: the same protocol, tiny chains."""
    settings.challenge_scale = 1e-7
    settings.challenge_memory_share = 0.5
    return settings


async def issue(app: FastAPI) -> None:
    await challenge_loop.run_once(app.state.replica)


async def node_row(app: FastAPI, node_id: str) -> NodeRow:
    replica: Replica = app.state.replica
    async with replica.db.read() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        return row


async def challenge_rows(app: FastAPI, node_id: str) -> list[ChallengeRow]:
    replica: Replica = app.state.replica
    async with replica.db.read() as session:
        query = select(ChallengeRow).where(ChallengeRow.node_id == node_id)
        return list((await session.scalars(query.order_by(ChallengeRow.issued_at))).all())


async def gpu_node(sim_agent: AgentFactory, count: int = 1) -> SimulatedAgent:
    return await sim_agent(inventory(gpus=[H100] * count))


def ticking(clock: FrozenClock, seconds: float) -> ChallengeAnswer:
    """An honest node whose chain takes `seconds` on the coordinator's clock."""
    return ChallengeAnswer(before_commit=lambda: clock.advance(seconds))


async def test_an_honest_gpu_passes_and_is_verified_as_its_catalog_model(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await gpu_node(sim_agent)
    assert (await agent.heartbeat()).challenge is None
    await issue(app)
    order = (await agent.heartbeat()).challenge
    assert order is not None
    assert (order.kind, order.target, order.gpu_index) == ("gpu", H100.uuid, 0)
    assert order.claimed_model == "NVIDIA H100 80GB"

    answered = await agent.answer_challenge(ticking(clock, 3.0))
    verdict = answered.verdict
    assert verdict is not None and verdict.status is ChallengeStatus.PASSED, verdict
    flops = answered.chain.shape.flops
    assert verdict.rate == pytest.approx(flops / 3.0 / 1e12, rel=1e-3)
    assert verdict.rate_unit == "TFLOP/s"

    node = await node_row(app, agent.node_id or "")
    assert node.verification == {
        H100.uuid: {
            "model": "NVIDIA H100 80GB",
            "verified_at": clock.now().isoformat(),
            "challenge_id": order.id,
            "rate_tflops": pytest.approx(verdict.rate, rel=1e-3),
        }
    }
    assert node.next_challenge_at is not None
    assert timedelta(days=3) <= node.next_challenge_at - clock.now() <= timedelta(days=10)
    assert (await agent.heartbeat()).challenge is None
    await issue(app)
    assert (await agent.heartbeat()).challenge is None  # nothing due until then

    for path, headers in (
        (
            f"/v1/provider/nodes/{agent.node_id}/challenges",
            {"Authorization": f"Bearer {provider.key}"},
        ),
        (f"/v1/admin/nodes/{agent.node_id}/challenges", ADMIN),
    ):
        listed = await client.get(path, headers=headers)
        assert listed.status_code == 200, listed.text
        [shown] = listed.json()
        assert shown["id"] == order.id and shown["status"] == "passed"
        assert shown["verdict"]["rate_unit"] == "TFLOP/s" and shown["params"]["kind"] == "gpu"


async def test_a_cpu_node_is_verified_for_its_cores(
    app: FastAPI, clock: FrozenClock, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory())
    await issue(app)
    answered = await agent.answer_challenge(ticking(clock, 2.0))
    assert answered.verdict is not None and answered.verdict.status is ChallengeStatus.PASSED
    assert answered.verdict.rate_unit == "GFLOP/s"
    node = await node_row(app, agent.node_id or "")
    assert node.verification is not None
    proof = node.verification["cpu"]
    assert proof["cores"] == 4 and proof["verified_at"] == clock.now().isoformat()
    assert proof["rate_gflops"] == pytest.approx(answered.chain.shape.flops / 2.0 / 1e9, rel=1e-3)


async def test_a_commit_after_the_deadline_fails_the_challenge(
    app: FastAPI, clock: FrozenClock, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    answered = await agent.answer_challenge(ticking(clock, DEADLINE_SEC + 1))
    verdict = answered.verdict
    assert verdict is not None and verdict.status is ChallengeStatus.FAILED
    assert verdict.reason == "committed 51.0 s after the start; the deadline is 50 s"
    assert not (await node_row(app, agent.node_id or "")).verification


@pytest.mark.parametrize(
    ("cheat", "why"),
    [
        (ChallengeAnswer(made_up_sketches=True), "does not match the sketch committed"),
        (ChallengeAnswer(tampered_rows=True), "X_(t+1)'s chunk does not match the sketch"),
        (ChallengeAnswer(other_matrix=True), "is not what the step gives"),
    ],
    ids=["made-up-sketches", "rows-not-matching-sketches", "another-chain"],
)
async def test_an_answer_that_is_not_the_seeded_chain_fails_at_the_reveal(
    app: FastAPI, sim_agent: AgentFactory, cheat: ChallengeAnswer, why: str
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    answered = await agent.answer_challenge(cheat)
    verdict = answered.verdict
    assert verdict is not None and verdict.status is ChallengeStatus.FAILED
    assert why in (verdict.reason or ""), verdict.reason
    assert not (await node_row(app, agent.node_id or "")).verification


async def test_a_reveal_after_its_deadline_fails(
    app: FastAPI, clock: FrozenClock, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    late = ChallengeAnswer(before_reveal=lambda: clock.advance(DEADLINE_SEC + 5))
    verdict = (await agent.answer_challenge(late)).verdict
    assert verdict is not None and verdict.status is ChallengeStatus.FAILED
    assert (verdict.reason or "").startswith("revealed 55.0 s after the commit")


@pytest.mark.parametrize("stops", ["before-start", "before-commit", "before-reveal"])
async def test_a_challenge_never_answered_expires_and_unverifies_the_gpu(
    app: FastAPI, clock: FrozenClock, settings: Settings, sim_agent: AgentFactory, stops: str
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    await agent.answer_challenge()
    node = await node_row(app, agent.node_id or "")
    assert node.verification and node.next_challenge_at is not None
    clock.advance((node.next_challenge_at - clock.now()).total_seconds() + 1)
    await agent.heartbeat()
    await issue(app)  # the re-check round: the verified GPU is challenged again
    if stops == "before-start":
        assert (await agent.heartbeat()).challenge is not None
        clock.advance(settings.challenge_start_within_sec + 1)
    else:
        how = ChallengeAnswer(commit=stops != "before-commit", reveal=False)
        assert (await agent.answer_challenge(how)).verdict is None
        clock.advance(DEADLINE_SEC + 1)
    await agent.heartbeat()  # the node is still online, it just did not answer
    await issue(app)
    rows = await challenge_rows(app, agent.node_id or "")
    assert [r.status for r in rows] == ["passed", "expired"]
    assert rows[1].verdict and "within" in rows[1].verdict["reason"]
    assert (await node_row(app, agent.node_id or "")).verification == {}


async def test_after_a_failure_the_next_challenge_waits_the_retry_time(
    app: FastAPI, clock: FrozenClock, settings: Settings, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    await agent.answer_challenge(ChallengeAnswer(made_up_sketches=True))
    await issue(app)
    assert (await agent.heartbeat()).challenge is None
    clock.advance(settings.challenge_retry_sec + 1)
    await agent.heartbeat()
    await issue(app)
    assert (await agent.heartbeat()).challenge is not None


async def test_a_node_cannot_touch_another_nodes_challenge(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    owner = await gpu_node(sim_agent)
    other = await sim_agent(inventory(gpus=[H100.model_copy(update={"uuid": "GPU-other"})]))
    await issue(app)
    order = (await owner.heartbeat()).challenge
    assert order is not None
    headers = {"Authorization": f"Bearer {other.client.key}"}
    bodies: dict[str, Any] = {
        "start": None,
        "commit": {"sketches": ""},
        "reveal": {"samples": []},
    }
    for step, body in bodies.items():
        answer = await client.post(
            f"/v1/agent/challenges/{order.id}/{step}", json=body, headers=headers
        )
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "NOT_FOUND"
    [row] = await challenge_rows(app, owner.node_id or "")
    assert row.status == "issued"
    listed = await client.get(f"/v1/admin/nodes/{other.node_id}/challenges", headers=ADMIN)
    assert [c["target"] for c in listed.json()] == ["GPU-other"]


async def test_answers_out_of_order_or_malformed_change_nothing(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    order = (await agent.heartbeat()).challenge
    assert order is not None
    headers = {"Authorization": f"Bearer {agent.client.key}"}
    path = f"/v1/agent/challenges/{order.id}"
    early = await client.post(f"{path}/commit", json={"sketches": "AAAA"}, headers=headers)
    assert early.status_code == 409, early.text
    first = await client.post(f"{path}/start", headers=headers)
    again = await client.post(f"{path}/start", headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()  # a lost answer costs nothing: same seed, same clock
    big = "A" * (3 << 20)  # over the JSON limit of other routes: a commit may be this big
    for body in ({"sketches": "AAAA"}, {"sketches": "not base64!"}, {"sketches": big}):
        wrong = await client.post(f"{path}/commit", json=body, headers=headers)
        assert wrong.status_code == 422, wrong.text[:300]
    unasked = await client.post(f"{path}/reveal", json={"samples": []}, headers=headers)
    assert unasked.status_code == 409
    [row] = await challenge_rows(app, agent.node_id or "")
    assert row.status == "started" and row.commitment is None


async def test_an_inventory_change_clears_that_gpus_verification_and_challenges_it_again(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent, count=2)
    for _ in range(2):  # one challenge at a time: each GPU in turn
        await issue(app)
        verdict = (await agent.answer_challenge()).verdict
        assert verdict is not None and verdict.status is ChallengeStatus.PASSED
    [first, second] = agent.inventory.gpus
    node = await node_row(app, agent.node_id or "")
    assert set(node.verification or {}) == {first.uuid, second.uuid}

    new_driver = second.model_copy(update={"driver_version": "560.28.03"})
    changed = agent.inventory.model_copy(update={"gpus": [first, new_driver]})
    await agent.client.update_inventory(changed)
    node = await node_row(app, agent.node_id or "")
    assert set(node.verification or {}) == {first.uuid}
    await issue(app)
    order = (await agent.heartbeat()).challenge
    assert order is not None and order.target == second.uuid


async def test_a_pass_is_challenged_again_between_three_and_ten_days_later(
    app: FastAPI, clock: FrozenClock, sim_agent: AgentFactory
) -> None:
    agent = await gpu_node(sim_agent)
    await issue(app)
    await agent.answer_challenge()
    node = await node_row(app, agent.node_id or "")
    due = node.next_challenge_at
    assert due is not None and timedelta(days=3) <= due - clock.now() <= timedelta(days=10)
    clock.advance((due - clock.now()).total_seconds() - 60)
    await agent.heartbeat()
    await issue(app)
    assert (await agent.heartbeat()).challenge is None  # not yet
    clock.advance(61)
    await agent.heartbeat()
    await issue(app)
    order = (await agent.heartbeat()).challenge
    assert order is not None and order.target == H100.uuid
    assert (await node_row(app, agent.node_id or "")).verification  # verified meanwhile
    verdict = (await agent.answer_challenge()).verdict
    assert verdict is not None and verdict.status is ChallengeStatus.PASSED
    later = (await node_row(app, agent.node_id or "")).next_challenge_at
    assert later is not None and later - clock.now() >= timedelta(days=3)


async def test_a_gpu_the_catalog_does_not_know_is_never_challenged(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(gpus=[UNKNOWN_CARD]))
    await issue(app)
    assert (await agent.heartbeat()).challenge is None
