"""Leasing one job (`services/work/leased_jobs.py`, its files through `artifact_refs.py`):
what the agent is handed for a platform artifact, and an invoke whose artifact expired
while it waited. Which jobs a claim takes is test_claims'; a lease's life, test_leases'."""

import hashlib

import httpx

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.work.test_invokes import orm_statements, upload
from tests.coordinator.services.work.test_leases import CPU_HELLO, status_of, submit

MODEL = identity_model("leased")  # uploads are checked: a model must be an ONNX graph


async def test_a_platform_artifact_is_leased_as_a_signed_link_with_its_own_checksum(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    model = await upload(client, tenant, MODEL)
    invoke_id = await submit(client, tenant, {**CPU_HELLO, "model_url": model["url"]})
    (job,) = await agent.lease()
    assert job.invoke_id == invoke_id
    assert job.model.platform
    assert (job.model.sha256, job.model.size) == (hashlib.sha256(MODEL).hexdigest(), len(MODEL))
    assert job.model.url.startswith(model["url"] + "?token=")
    fetched = await client.get(job.model.url)  # the link alone: no key
    assert (fetched.status_code, fetched.content) == (200, MODEL)


async def test_an_invoke_whose_artifact_expired_while_queued_fails_instead_of_being_leased(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    agent = await sim_agent()
    model = await upload(client, tenant, MODEL)
    invoke_id = await submit(client, tenant, {**CPU_HELLO, "model_url": model["url"]})
    clock.advance(settings.artifact_ttl_sec + 1)
    await agent.heartbeat()
    assert await agent.lease() == []
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "failed"
    assert state["error"]["code"] == "ARTIFACT_EXPIRED"
    assert state["attempts"] == 0


async def test_a_lease_reads_its_platform_artifacts_without_the_orm(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    # Every lease of a job that uses platform artifacts reads them; on the driver, with
    # their blobs (`artifact_refs.load_artifacts`), a claim stays clear of the ORM.
    agent = await sim_agent()
    model = await upload(client, tenant, MODEL)
    await submit(client, tenant, {**CPU_HELLO, "model_url": model["url"]})
    with orm_statements() as statements:
        (job,) = await agent.lease()
    assert job.model.platform
    assert job.model.sha256 == hashlib.sha256(MODEL).hexdigest()
    assert statements == []
