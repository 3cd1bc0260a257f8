"""`wait` follows an invoke with the coordinator's long-poll (`GET …?wait=N`): the end
comes back in the request that is open when it happens, not at the next poll.

Every request the SDK sends is recorded by a transport wrapped around the real one,
so the tests count requests instead of timing them.
"""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI, Request

from gpu_share import AsyncClient, Client, WaitTimeout
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model
from gpu_share.testing.servers import serve
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report

MODEL = identity_model()
RETRY = RetryPolicy(backoff_base=0.01)


class RecordingAsgi(httpx.ASGITransport):
    def __init__(self, app: FastAPI) -> None:
        super().__init__(app=app)
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await super().handle_async_request(request)


class RecordingHttp(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


def status_reads(requests: list[httpx.Request], invoke_id: str) -> list[httpx.Request]:
    return [
        r for r in requests if r.method == "GET" and r.url.path == f"/v1/gpu/invokes/{invoke_id}"
    ]


def submits(requests: list[httpx.Request]) -> list[httpx.Request]:
    return [r for r in requests if r.method == "POST" and r.url.path == "/v1/gpu/invoke"]


async def test_invoke_and_wait_gets_a_short_job_finished_in_the_submits_answer(
    app: FastAPI,
    tenant: TenantHandle,
    serving: Callable[..., Awaitable[SimulatedAgent]],
) -> None:
    async def after_a_moment(job: wire.LeasedJob) -> wire.ResultReport:
        await asyncio.sleep(0.4)
        return done_report(job)

    await serving(after_a_moment)
    transport = RecordingAsgi(app)
    statuses: list[InvokeStatus] = []
    async with AsyncClient(
        "http://testserver", tenant.key, transport=transport, poll_interval=30
    ) as client:
        out = await client.invoke_and_wait(
            "onnx_cpu", MODEL, wait_timeout=120, on_status=lambda i: statuses.append(i.status)
        )
    assert out.invoke.status is InvokeStatus.DONE
    # The submit asked to be held for the first window (`Prefer: wait`) and came back
    # with the job done: no status request at all.
    (submit,) = submits(transport.requests)
    assert submit.headers["prefer"] == "wait=30"
    assert status_reads(transport.requests, out.invoke.id) == []
    assert statuses == [InvokeStatus.DONE]


async def test_invoke_and_wait_follows_a_longer_job_with_one_long_poll(
    app: FastAPI,
    tenant: TenantHandle,
    serving: Callable[..., Awaitable[SimulatedAgent]],
) -> None:
    async def a_while(job: wire.LeasedJob) -> wire.ResultReport:
        await asyncio.sleep(1.6)
        return done_report(job)

    await serving(a_while)
    transport = RecordingAsgi(app)
    statuses: list[InvokeStatus] = []
    async with AsyncClient(
        "http://testserver", tenant.key, transport=transport, poll_interval=1
    ) as client:
        out = await client.invoke_and_wait(
            "onnx_cpu", MODEL, wait_timeout=120, on_status=lambda i: statuses.append(i.status)
        )
    assert out.invoke.status is InvokeStatus.DONE
    (submit,) = submits(transport.requests)
    assert submit.headers["prefer"] == "wait=1"
    # The submit came back after its second with the job still going; from there the
    # wait follows it with long-polls, the first one a window long.
    waits = [r.url.params.get("wait") for r in status_reads(transport.requests, out.invoke.id)]
    assert waits and waits[0] == "1" and None not in waits
    assert statuses[0] is not InvokeStatus.DONE and statuses[-1] is InvokeStatus.DONE


async def test_each_long_poll_outlasts_the_clients_read_timeout(
    app: FastAPI, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()  # online but not leasing: the invoke stays queued
    async with serve(app, lifespan=False) as base_url:

        def wait_for_a_queued_invoke() -> tuple[str, list[httpx.Request]]:
            transport = RecordingHttp()
            with Client(
                base_url,
                tenant.key,
                timeout=1.0,  # shorter than the 3 s the server holds a read
                poll_interval=3,
                retry=RETRY,
                transport=transport,
            ) as client:
                model = client.upload_artifact(MODEL, "model")
                queued = client.invoke("onnx_cpu", model.url)
                with pytest.raises(WaitTimeout) as caught:
                    client.wait(queued.id, timeout=3.5)
            assert caught.value.last_status == "queued"
            return queued.id, transport.requests

        invoke_id, requests = await asyncio.to_thread(wait_for_a_queued_invoke)
    reads = status_reads(requests, invoke_id)
    held = [float(r.url.params["wait"]) for r in reads[1:]]
    assert "wait" not in reads[0].url.params  # where it stands now, at once
    assert held[0] == 3.0 and 0 < held[-1] <= 0.5  # a window, then what is left of timeout
    assert len(held) <= 3


async def test_a_server_without_long_poll_is_polled_at_the_interval_not_hammered() -> None:
    reads: list[str | None] = []
    app = FastAPI()

    @app.get("/v1/gpu/invokes/{invoke_id}")
    async def answer_at_once(invoke_id: str, request: Request) -> dict[str, object]:
        reads.append(request.query_params.get("wait"))
        return queued_invoke(invoke_id)

    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(
        "http://old-server",
        "gpu_sk_test",
        transport=transport,
        poll_interval=0.2,
        max_poll_interval=0.2,
    ) as client:
        with pytest.raises(WaitTimeout):
            await client.wait("inv_old", timeout=1.0)
    # 1 read at once, then one per 0.2 s window of the 1 s: without the pause for the
    # rest of each window, hundreds.
    assert 2 <= len(reads) <= 8
    assert reads[1] == "0.2"


def queued_invoke(invoke_id: str) -> dict[str, object]:
    return {
        "id": invoke_id,
        "status": "queued",
        "runtime": "onnx_cpu",
        "model_url": "https://models.example/model.onnx",
        "inputs_url": "",
        "timeout_sec": 600,
        "priority": "on_demand",
        "node_id": None,
        "attempts": 0,
        "created_at": datetime.now(UTC).isoformat(),
        "assigned_at": None,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
    }
