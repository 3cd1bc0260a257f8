"""No node can act on work leased to another: start, logs, heartbeats, outputs, checkpoints
and results carrying another node's lease token are all refused, and change nothing."""

import base64
import hashlib
from pathlib import Path

import httpx
import pytest

from gpu_share.agent.client import StaleLease
from gpu_share.protocol import agent as wire
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}


async def leased_elsewhere(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> tuple[wire.LeasedJob, SimulatedAgent, SimulatedAgent]:
    owner, rogue = await sim_agent(), await sim_agent()
    response = await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    assert response.status_code == 202
    (job,) = await owner.lease()
    return job, owner, rogue


async def test_another_node_cannot_start_log_or_report_with_a_stolen_lease(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    job, owner, rogue = await leased_elsewhere(client, tenant, sim_agent)
    with pytest.raises(StaleLease):
        await rogue.client.start(job.invoke_id, job.lease_token)
    with pytest.raises(StaleLease):
        await rogue.client.append_logs(job.invoke_id, job.lease_token, "forged line\n")
    with pytest.raises(StaleLease):
        await rogue.client.report(job.invoke_id, done_report(job, b"forged"), retry_for=0)
    ack = await rogue.heartbeat([job])
    assert ack.leases[0].verdict is wire.LeaseVerdict.DROP

    await owner.complete(job, b"genuine")
    final = (await client.get(f"/v1/gpu/invokes/{job.invoke_id}", headers=tenant.headers)).json()
    assert final["status"] == "done" and final["node_id"] == owner.node_id
    assert base64.b64decode(final["result"]["outputs_inline_base64"]) == b"genuine"
    logs = await client.get(f"/v1/gpu/invokes/{job.invoke_id}/logs", headers=tenant.headers)
    assert "forged" not in logs.text


async def test_another_node_cannot_store_outputs_or_checkpoints_for_a_lease(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, tmp_path: Path
) -> None:
    job, _owner, rogue = await leased_elsewhere(client, tenant, sim_agent)
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 1000)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StaleLease):
        await rogue.client.store_outputs(job.invoke_id, job.lease_token, path, sha)
    with pytest.raises(StaleLease):
        await rogue.client.store_checkpoint(job.invoke_id, job.lease_token, path, sha)
    listed = await client.get("/v1/artifacts", headers=tenant.headers)
    assert listed.json()["items"] == []  # nothing was stored in the tenant's name


async def test_a_node_never_leases_work_it_cannot_serve_or_another_node_holds(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    job, _owner, rogue = await leased_elsewhere(client, tenant, sim_agent)
    assert await rogue.lease() == []
    with pytest.raises(StaleLease):
        await rogue.client.start(job.invoke_id, "0" * 32)
