"""Spot work gives way to on-demand work (SPEC §4.3; docs/placement.md, "Spot"):
the PREEMPT verdict, the requeue that is never a failure, and the faults around it."""

import hashlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.agent.client import CoordinatorError, StaleLease
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import lease_expiry
from gpu_share.coordinator.loops import preemption as preemption_loop
from gpu_share.protocol import agent as wire
from gpu_share.protocol.agent import LeaseVerdict
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import (
    H100,
    AgentFactory,
    SimulatedAgent,
    done_report,
    inventory,
)
from tests.coordinator.services.money.test_billing import (
    RATE,
    RESERVE,
    assert_books_balance,
    balances,
    postings,
    set_price,
    top_up,
)
from tests.coordinator.services.work.test_checkpoints import catboost_snapshot

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}
SPOT = {**CPU_HELLO, "priority": "spot"}


async def submit(client: httpx.AsyncClient, tenant: TenantHandle, body: dict[str, Any]) -> str:
    response = await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.text
    invoke_id: str = response.json()["id"]
    return invoke_id


async def state_of(client: httpx.AsyncClient, tenant: TenantHandle, invoke_id: str) -> Any:
    return (await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)).json()


async def logs_of(client: httpx.AsyncClient, tenant: TenantHandle, invoke_id: str) -> str:
    return (await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)).text


async def preempt(app: FastAPI) -> list[str]:
    return await preemption_loop.run_once(app.state.replica)


GRACE_SEC = Settings.model_fields["preemption_grace_sec"].default
COOLDOWN_SEC = Settings.model_fields["preemption_cooldown_sec"].default


def waited(app: FastAPI, seconds: float = GRACE_SEC) -> None:
    """Let the queued on-demand work wait: it asks for a preemption only after the grace."""
    app.state.replica.clock.advance(seconds)


async def running_spot(
    client: httpx.AsyncClient, tenant: TenantHandle, agent: SimulatedAgent
) -> wire.LeasedJob:
    await submit(client, tenant, SPOT)
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    return job


async def test_on_demand_work_preempts_the_spot_job_on_the_only_node(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    spot = await running_spot(client, tenant, agent)
    clock.advance(30)
    await agent.heartbeat([spot])
    urgent = await submit(client, tenant, CPU_HELLO)
    assert await agent.lease() == []  # its one slot is taken

    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot.invoke_id]
    assert await preempt(app) == []  # asked once: its slot already counts as freed
    ack = await agent.heartbeat([spot])
    assert ack.leases[0].verdict is LeaseVerdict.PREEMPT
    await agent.client.report_preempted(spot.invoke_id, spot.lease_token, retry_for=0)

    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["attempts"]) == ("queued", 1, 1)
    assert state["error"] is None and state["started_at"] is None
    (taken,) = await agent.lease()
    assert taken.invoke_id == urgent  # the on-demand job gets the slot
    await agent.client.start(taken.invoke_id, taken.lease_token)
    assert await preempt(app) == []  # nothing spot is running: nothing to ask
    await agent.client.report(taken.invoke_id, done_report(taken), retry_for=0)
    (again,) = await agent.lease()
    assert (again.invoke_id, again.attempt) == (spot.invoke_id, 2)
    await agent.complete(again)
    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["attempts"]) == ("done", 1, 2)
    logs = await logs_of(client, tenant, spot.invoke_id)
    assert f"on-demand invoke {urgent} needs its slot" in logs
    assert "preempted on node" in logs and "requeued (preemption 1)" in logs
    page = await console_page(app, tenant, f"/console/invokes/{spot.invoke_id}")
    assert re.search(r'<dd id="preemptions">1\b', page)


async def console_page(app: FastAPI, tenant: TenantHandle, path: str) -> str:
    """A console page as the signed-in tenant sees it."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        form = (await http.get("/signin")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        signed = await http.post("/signin", data={"csrf": csrf[1], "key": tenant.key})
        assert signed.status_code == 303, signed.text
        page = await http.get(path)
        assert page.status_code == 200
        return page.text


async def test_no_preemption_while_another_node_has_room(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    busy, idle = await sim_agent(), await sim_agent()
    await idle.heartbeat()
    await running_spot(client, tenant, busy)
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == []


async def test_on_demand_work_no_preemption_would_help_preempts_nothing(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    eu = await sim_agent(inventory(region="eu"))
    us = await sim_agent(inventory(region="us"))
    await running_spot(client, tenant, eu)
    await submit(client, tenant, {**CPU_HELLO, "region": "us"})
    (held,) = await us.lease()  # an on-demand job holds the only node that serves it
    await submit(client, tenant, {**CPU_HELLO, "region": "us"})
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == []  # the eu spot job's slot would not help
    del held


async def test_the_most_recently_started_spot_job_is_the_one_preempted(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent(inventory(slots=2))
    older = await running_spot(client, tenant, agent)
    clock.advance(5)
    newer = await running_spot(client, tenant, agent)
    await agent.heartbeat([older, newer])
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [newer.invoke_id]  # one is enough, never both
    ack = await agent.heartbeat([older, newer])
    verdicts = {status.invoke_id: status.verdict for status in ack.leases}
    assert verdicts == {older.invoke_id: LeaseVerdict.KEEP, newer.invoke_id: LeaseVerdict.PREEMPT}


def gpus(count: int) -> list[GpuInfo]:
    return [
        H100.model_copy(update={"index": n, "uuid": f"GPU-{n:08d}", "pci_bus_id": f"0:{n}"})
        for n in range(count)
    ]


GPU_SPOT = {**HELLO_WORLD, "priority": "spot"}  # onnx_cuda


async def running_gpu_spot(
    client: httpx.AsyncClient, tenant: TenantHandle, agent: SimulatedAgent, gpus: int
) -> wire.LeasedJob:
    await submit(client, tenant, {**GPU_SPOT, "gpus": gpus})
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    return job


async def test_one_spot_job_that_frees_enough_gpus_alone_is_preferred(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=gpus(3), slots=3))
    wide = await running_gpu_spot(client, tenant, agent, 2)
    clock.advance(5)
    narrow = await running_gpu_spot(client, tenant, agent, 1)  # the most recent, too small
    await agent.heartbeat([wide, narrow])
    await submit(client, tenant, {**HELLO_WORLD, "gpus": 2})
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [wide.invoke_id]


async def test_when_no_single_spot_job_frees_enough_gpus_the_newest_go_first(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=gpus(3), slots=3))
    jobs = []
    for _ in range(3):
        jobs.append(await running_gpu_spot(client, tenant, agent, 1))
        clock.advance(5)
    await agent.heartbeat(jobs)
    await submit(client, tenant, {**HELLO_WORLD, "gpus": 2})
    waited(app)  # the on-demand work has queued for the grace
    assert sorted(await preempt(app)) == sorted(j.invoke_id for j in jobs[1:])
    assert await preempt(app) == []  # the oldest keeps running: two GPUs are enough


async def test_a_job_that_finished_just_before_the_preemption_keeps_its_result(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    spot = await running_spot(client, tenant, agent)
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot.invoke_id]
    await agent.client.report(spot.invoke_id, done_report(spot), retry_for=0)  # the result wins
    with pytest.raises(StaleLease):
        await agent.client.report_preempted(spot.invoke_id, spot.lease_token, retry_for=0)
    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["cost"]) == ("done", 0, "0")
    assert (await agent.heartbeat([spot])).leases[0].verdict is LeaseVerdict.DROP


async def test_a_node_lost_during_its_preemption_is_requeued_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    lost, healthy = await sim_agent(), await sim_agent()
    spot = await running_spot(client, tenant, lost)
    urgent = await submit(client, tenant, CPU_HELLO)
    (held,) = await healthy.lease()  # the healthy node is busy with the on-demand job
    assert held.invoke_id == urgent
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot.invoke_id]
    ack = await lost.heartbeat([spot])  # it hears PREEMPT; its lease is not extended
    assert ack.leases[0].verdict is LeaseVerdict.PREEMPT
    clock.advance(settings.lease_ttl_sec + 1)  # ... then it goes silent
    await healthy.heartbeat([held])
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 0
    with pytest.raises(StaleLease):
        await lost.client.report_preempted(spot.invoke_id, spot.lease_token, retry_for=0)
    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["attempts"]) == ("queued", 1, 1)
    assert "did not confirm before its lease ran out; requeued" in await logs_of(
        client, tenant, spot.invoke_id
    )


async def test_preempt_for_a_lease_the_node_no_longer_holds_is_refused(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    spot = await running_spot(client, tenant, agent)
    with pytest.raises(StaleLease):  # never asked to stop
        await agent.client.report_preempted(spot.invoke_id, spot.lease_token, retry_for=0)
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot.invoke_id]
    stale = spot.model_copy(update={"lease_token": "0" * 32})
    assert (await agent.heartbeat([stale])).leases[0].verdict is LeaseVerdict.DROP
    with pytest.raises(StaleLease):
        await agent.client.report_preempted(spot.invoke_id, stale.lease_token, retry_for=0)
    assert (await state_of(client, tenant, spot.invoke_id))["status"] == "running"


async def test_preemptions_never_count_against_max_attempts(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    agent = await sim_agent()
    spot_id = await submit(client, tenant, SPOT)
    for _ in range(settings.max_attempts):
        (job,) = await agent.lease()
        await agent.client.start(job.invoke_id, job.lease_token)
        urgent = await submit(client, tenant, CPU_HELLO)
        waited(app)  # the on-demand work has queued for the grace
        assert await preempt(app) == [spot_id]
        await agent.client.report_preempted(job.invoke_id, job.lease_token, retry_for=0)
        (taken,) = await agent.lease()
        assert taken.invoke_id == urgent
        await agent.complete(taken)
    (job,) = await agent.lease()  # then its node is lost once: requeued, not failed
    clock.advance(settings.lease_ttl_sec + 1)
    await agent.heartbeat()
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1
    state = await state_of(client, tenant, spot_id)
    assert (state["status"], state["preemptions"]) == ("queued", settings.max_attempts)
    assert "requeued (attempt 1 of 3)" in await logs_of(client, tenant, spot_id)
    del job


TRAIN = {
    "runtime": "catboost_cpu",
    "model_url": "https://example.com/train_config.json",
    "inputs_url": "https://example.com/data.npz",
    "timeout_sec": 600,
}
SPOT_RATE = RATE // 2  # the 50 % spot discount `set_price` gives


async def save_checkpoint(
    agent: SimulatedAgent, job: wire.LeasedJob, tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "snapshot"
    path.write_bytes(data)
    await agent.client.store_checkpoint(
        job.invoke_id, job.lease_token, path, hashlib.sha256(data).hexdigest()
    )


async def test_a_preempted_attempt_is_charged_up_to_its_last_checkpoint_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    tmp_path: Path,
) -> None:
    agent = await sim_agent(inventory(runtimes=[RuntimeName.CATBOOST_CPU]))
    await set_price(app, agent, provider, RATE)
    await top_up(client, tenant, "1")
    spot_id = await submit(client, tenant, {**TRAIN, "priority": "spot"})
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    clock.advance(100)
    await save_checkpoint(agent, job, tmp_path, catboost_snapshot(b"after 100 s" * 2))
    clock.advance(20)  # work after the checkpoint: lost to the preemption, never charged
    await agent.heartbeat([job])
    urgent = await submit(client, tenant, TRAIN)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot_id]
    await agent.client.report_preempted(job.invoke_id, job.lease_token, retry_for=0)
    kept = SPOT_RATE * 100_000 // 3_600_000  # 34722
    assert await postings(app, f"invoke:{spot_id}:attempt:1:preempted") == 1
    assert (await balances(app, tenant, provider))["reserved"] == 2 * RESERVE - kept

    (taken,) = await agent.lease()
    assert taken.invoke_id == urgent
    await agent.client.start(taken.invoke_id, taken.lease_token)
    clock.advance(10)
    await agent.client.report(taken.invoke_id, done_report(taken), retry_for=0)
    (resumed,) = await agent.lease()
    assert resumed.invoke_id == spot_id and resumed.checkpoint is not None
    await agent.client.start(resumed.invoke_id, resumed.lease_token)
    clock.advance(50)
    await agent.client.report(resumed.invoke_id, done_report(resumed), retry_for=0)
    await agent.client.report(resumed.invoke_id, done_report(resumed), retry_for=0)  # a retry

    final = SPOT_RATE * 50_000 // 3_600_000  # 17361
    state = await state_of(client, tenant, spot_id)
    assert (state["status"], state["preemptions"]) == ("done", 1)
    assert state["cost"] == f"0.0{kept + final}"
    on_demand = RATE * 10_000 // 3_600_000
    assert (await state_of(client, tenant, urgent))["cost"] == f"0.00{on_demand}"
    assert await postings(app, f"invoke:{spot_id}:settle") == 1
    money = await balances(app, tenant, provider)
    assert (money["available"], money["reserved"]) == (1_000_000 - kept - final - on_demand, 0)
    assert money["provider"] + money["commission"] == kept + final + on_demand
    await assert_books_balance(app)


async def test_a_preempted_attempt_without_a_checkpoint_costs_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    lost, healthy = await sim_agent(), await sim_agent()
    for node in (lost, healthy):
        await set_price(app, node, provider, RATE)
    await top_up(client, tenant, "2")
    spot = await running_spot(client, tenant, lost)
    clock.advance(100)
    await lost.heartbeat([spot])
    await healthy.heartbeat()
    urgent = await submit(client, tenant, CPU_HELLO)
    (held,) = await healthy.lease()
    assert held.invoke_id == urgent
    await submit(client, tenant, CPU_HELLO)
    waited(app)  # the on-demand work has queued for the grace
    assert await preempt(app) == [spot.invoke_id]
    clock.advance(settings.lease_ttl_sec + 1)  # lost during the preemption
    await healthy.heartbeat([held])
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1
    await healthy.client.report(held.invoke_id, done_report(held), retry_for=0)
    (second,) = await healthy.lease()
    assert second.invoke_id != spot.invoke_id  # on-demand work first
    await healthy.complete(second)
    (retry,) = await healthy.lease()
    assert retry.invoke_id == spot.invoke_id
    await healthy.client.start(retry.invoke_id, retry.lease_token)
    clock.advance(36)
    await healthy.client.report(retry.invoke_id, done_report(retry), retry_for=0)
    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["cost"]) == ("done", 1, "0.0125")
    assert await postings(app, f"invoke:{spot.invoke_id}:attempt:1:preempted") == 0
    await assert_books_balance(app)


# Preemption is no weapon (docs/placement.md, "Spot"): asked only for work that waited,
# withdrawn when that work no longer needs it, and never paid for with junk


async def verdict_of(agent: SimulatedAgent, job: wire.LeasedJob) -> LeaseVerdict:
    return (await agent.heartbeat([job])).leases[0].verdict


async def test_on_demand_work_canceled_before_its_grace_is_out_stops_nothing(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    spot = await running_spot(client, tenant, agent)
    urgent = await submit(client, tenant, CPU_HELLO)
    assert await preempt(app) == []  # just submitted: it has not waited yet
    waited(app, GRACE_SEC - 1)
    assert await preempt(app) == []
    canceled = await client.post(f"/v1/gpu/invokes/{urgent}/cancel", headers=tenant.headers)
    assert canceled.json()["status"] == "canceled"
    waited(app)
    assert await preempt(app) == []
    assert await verdict_of(agent, spot) is LeaseVerdict.KEEP
    await agent.client.report(spot.invoke_id, done_report(spot), retry_for=0)
    state = await state_of(client, tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"]) == ("done", 0)


async def test_a_canceled_preemptor_leaves_the_spot_job_running(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    spot = await running_spot(client, other_tenant, agent)
    urgent = await submit(client, tenant, CPU_HELLO)
    waited(app)
    assert await preempt(app) == [spot.invoke_id]
    placed = await state_of(client, tenant, urgent)
    assert (placed["status"], placed["node_id"]) == ("queued", agent.node_id)
    await client.post(f"/v1/gpu/invokes/{urgent}/cancel", headers=tenant.headers)
    assert await verdict_of(agent, spot) is LeaseVerdict.KEEP  # withdrawn with the cancel
    assert await preempt(app) == []
    await agent.client.report(spot.invoke_id, done_report(spot), retry_for=0)
    state = await state_of(client, other_tenant, spot.invoke_id)
    assert (state["status"], state["preemptions"], state["attempts"]) == ("done", 0, 1)
    assert "preemption withdrawn" in await logs_of(client, other_tenant, spot.invoke_id)


async def test_a_preemption_is_withdrawn_when_its_work_runs_elsewhere_first(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    spotted, busy = await sim_agent(), await sim_agent()
    spot = await running_spot(client, tenant, spotted)
    first = await submit(client, tenant, CPU_HELLO)
    (held,) = await busy.lease()
    assert held.invoke_id == first
    urgent = await submit(client, tenant, CPU_HELLO)
    waited(app)
    await busy.heartbeat([held])
    assert await preempt(app) == [spot.invoke_id]
    await busy.complete(held)  # ... and the busy node frees up before the spot job stops
    (taken,) = await busy.lease()
    assert taken.invoke_id == urgent
    assert await preempt(app) == []
    assert await verdict_of(spotted, spot) is LeaseVerdict.KEEP
    assert (await state_of(client, tenant, spot.invoke_id))["status"] == "running"


async def test_a_tenant_that_cancels_work_placed_for_a_preemption_asks_none_for_a_while(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    """Submit, wait the grace, cancel once the spot job is asked to stop, again and again:
    the second time preempts nothing, while another tenant's work still may."""
    agent = await sim_agent()
    spot = await running_spot(client, other_tenant, agent)
    bait = await submit(client, tenant, CPU_HELLO)
    waited(app)
    assert await preempt(app) == [spot.invoke_id]
    await client.post(f"/v1/gpu/invokes/{bait}/cancel", headers=tenant.headers)
    again = await submit(client, tenant, CPU_HELLO)
    waited(app)
    await agent.heartbeat([spot])
    assert await preempt(app) == []
    assert await verdict_of(agent, spot) is LeaseVerdict.KEEP
    waited(app, COOLDOWN_SEC - 2 * GRACE_SEC)
    await agent.heartbeat([spot])
    assert await preempt(app) == []  # still cooling down
    waited(app, GRACE_SEC + 1)
    await agent.heartbeat([spot])
    assert await preempt(app) == [spot.invoke_id]  # the cooldown is over
    assert (await state_of(client, tenant, again))["node_id"] == agent.node_id


async def test_a_junk_checkpoint_is_refused_and_leaves_the_preempted_attempt_free(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    tmp_path: Path,
) -> None:
    """A node cannot bill a preempted tenant for progress with 150 bytes that resume
    nothing, for a training or (keeping no checkpoints) an inference."""
    agent = await sim_agent(inventory(runtimes=[RuntimeName.CATBOOST_CPU, RuntimeName.ONNX_CPU]))
    await set_price(app, agent, provider, RATE)
    await top_up(client, tenant, "1")
    for body in ({**TRAIN, "priority": "spot"}, SPOT):
        spot_id = await submit(client, tenant, body)
        (job,) = await agent.lease()
        await agent.client.start(job.invoke_id, job.lease_token)
        clock.advance(100)
        # Junk; and for the inference, even what a training would have written.
        refused_ones = [b"\0" * 150] + ([catboost_snapshot()] if body is SPOT else [])
        for data in refused_ones:
            with pytest.raises(CoordinatorError) as refused:
                await save_checkpoint(agent, job, tmp_path, data)
            assert refused.value.code == "VALIDATION_ERROR"
        clock.advance(20)
        await agent.heartbeat([job])
        urgent = await submit(client, tenant, CPU_HELLO)
        waited(app)
        await agent.heartbeat([job])
        assert await preempt(app) == [spot_id]
        await agent.client.report_preempted(job.invoke_id, job.lease_token, retry_for=0)
        assert await postings(app, f"invoke:{spot_id}:attempt:1:preempted") == 0
        (taken,) = await agent.lease()
        assert taken.invoke_id == urgent
        await agent.complete(taken)
        (again,) = await agent.lease()
        assert again.invoke_id == spot_id and again.checkpoint is None
        await agent.complete(again)
    await assert_books_balance(app)
