"""`POST /v1/gpu/invoke` with `Prefer: wait=N`: the finished invoke in the submit's answer
(200), or the usual 202 when it has not ended within N seconds; nothing changes for a
client that does not ask."""

import asyncio
import time

import httpx
import pytest

from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, done_report

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}


async def submit(client: httpx.AsyncClient, tenant: TenantHandle, **headers: str) -> httpx.Response:
    return await client.post(
        "/v1/gpu/invoke", json=CPU_HELLO, headers={**tenant.headers, **headers}
    )


async def test_an_invoke_that_ends_within_the_wait_is_answered_finished(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    submitting = asyncio.create_task(submit(client, tenant, Prefer="wait=30"))
    (job,) = await agent.lease(wait=10)  # the long-poll wakes when the invoke is queued
    await agent.client.start(job.invoke_id, job.lease_token)
    await asyncio.sleep(0.2)
    assert not submitting.done()  # running: the answer is held
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    answer = await asyncio.wait_for(submitting, 20)  # not the 30 s asked for
    assert answer.status_code == 200, answer.text
    assert answer.headers["preference-applied"] == "wait=30"
    assert answer.headers["location"] == f"/v1/gpu/invokes/{job.invoke_id}"
    body = answer.json()
    assert (body["id"], body["status"]) == (job.invoke_id, "done")
    assert body["result"] is not None


async def test_an_invoke_still_running_when_the_wait_ends_is_the_usual_202(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    started = time.monotonic()
    answer = await submit(client, tenant, Prefer="respond-async, wait=1")
    assert time.monotonic() - started >= 0.9  # it did wait
    assert answer.status_code == 202
    assert answer.headers["preference-applied"] == "wait=1"
    assert answer.json()["status"] == "queued"


async def test_without_a_wait_preference_nothing_changes(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    for headers in ({}, {"Prefer": "return=minimal"}):
        answer = await submit(client, tenant, **headers)
        assert answer.status_code == 202
        assert "preference-applied" not in answer.headers
        assert answer.json()["status"] == "queued"


async def test_an_idempotent_replay_of_a_finished_invoke_answers_it_at_once(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    first = await submit(client, tenant, **{"Idempotency-Key": "k1"})
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    again = await submit(client, tenant, Prefer="wait=60", **{"Idempotency-Key": "k1"})
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] == job.invoke_id


@pytest.mark.parametrize("prefer", ["wait=61", "wait=abc", "wait=2.5", "wait=-1"])
async def test_a_wait_that_cannot_be_honoured_queues_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, prefer: str
) -> None:
    await sim_agent()
    answer = await submit(client, tenant, Prefer=prefer)
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and "Prefer: wait=10" in error["message"]
    listed = await client.get("/v1/gpu/invokes", headers=tenant.headers)
    assert listed.json()["items"] == []


async def test_the_openapi_document_describes_the_preference(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/v1/gpu/invoke"]["post"]
    assert any(p["name"] == "prefer" and p["in"] == "header" for p in operation["parameters"])
    assert {"200", "202"} <= operation["responses"].keys()
