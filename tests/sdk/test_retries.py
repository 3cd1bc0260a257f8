"""Retries, error mapping and transport failures, against real servers.

A small FastAPI app of our own plays the server that answers 503 twice (or 429, or
codes the coordinator has no occasion to answer yet); a TCP proxy in front of the
real coordinator cuts an upload halfway; a closed port plays a server that is down.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from gpu_share import (
    AsyncClient,
    Client,
    NoCapacity,
    RateLimited,
    ServerUnreachable,
    ServiceUnavailable,
    UnexpectedResponse,
    ValidationError,
)
from gpu_share.protocol.errors import http_status
from gpu_share.protocol.invokes import Invoke
from gpu_share.sdk import RetryPolicy
from gpu_share.sdk.errors import API_ERRORS
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.simulated_agent import npz_bytes

QUICK = RetryPolicy(max_attempts=4, backoff_base=0.01, backoff_max=0.05)
QUEUED = Invoke.model_validate(
    {
        "id": "inv_flaky",
        "status": "queued",
        "runtime": "onnx_cpu",
        "model_url": "https://models.example/model.onnx",
        "inputs_url": "",
        "timeout_sec": 600,
        "priority": "on_demand",
        "node_id": None,
        "attempts": 0,
        "created_at": datetime.now(UTC),
        "assigned_at": None,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
    }
).model_dump(mode="json")


class Flaky:
    """A server whose first `failures` answers are errors; every request is recorded."""

    def __init__(
        self,
        failures: int,
        status: int = 503,
        code: str = "UNAVAILABLE",
        retry_after: str | None = "0",
    ) -> None:
        self.failures, self.status, self.code, self.retry_after = (
            failures,
            status,
            code,
            retry_after,
        )
        self.idempotency_keys: list[str | None] = []
        self.app = FastAPI()
        self.app.add_api_route("/v1/gpu/invoke", self.invoke, methods=["POST"])
        self.app.add_api_route("/v1/nodes", self.nodes, methods=["GET"])

    @property
    def hits(self) -> int:
        return len(self.idempotency_keys)

    def _error(self) -> JSONResponse:
        headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
        body = {"error": {"code": self.code, "message": f"{self.code} on purpose", "details": None}}
        return JSONResponse(body, status_code=self.status, headers=headers)

    async def invoke(self, request: Request) -> Response:
        self.idempotency_keys.append(request.headers.get("idempotency-key"))
        if self.hits <= self.failures:
            return self._error()
        return JSONResponse(QUEUED, status_code=202)

    async def nodes(self) -> Response:
        self.idempotency_keys.append(None)
        return self._error() if self.hits <= self.failures else JSONResponse([])


def client_for(app: FastAPI, retry: RetryPolicy = QUICK) -> AsyncClient:
    return AsyncClient(
        "http://flaky", "gpu_sk_test", transport=httpx.ASGITransport(app=app), retry=retry
    )


async def test_invoke_answered_503_twice_then_202_succeeds_with_one_idempotency_key() -> None:
    server = Flaky(failures=2)
    async with client_for(server.app) as client:
        invoke = await client.invoke("onnx_cpu", "https://models.example/model.onnx")
    assert invoke.id == "inv_flaky"
    assert server.hits == 3
    assert len(set(server.idempotency_keys)) == 1 and server.idempotency_keys[0]


async def test_retry_after_is_honoured_by_the_blocking_client_over_a_socket() -> None:
    server = Flaky(failures=1, status=429, code="RATE_LIMITED", retry_after="1")
    async with serve(server.app) as base_url:

        def invoke() -> float:
            with Client(base_url, "gpu_sk_test", retry=QUICK) as client:
                started = time.monotonic()
                client.invoke("onnx_cpu", "https://models.example/model.onnx")
                return time.monotonic() - started

        elapsed = await asyncio.to_thread(invoke)
    assert server.hits == 2
    assert elapsed >= 1.0  # the backoff alone would have been at most 0.05 s


async def test_retries_stop_after_max_attempts_with_the_last_error() -> None:
    server = Flaky(failures=100)
    async with client_for(server.app, RetryPolicy(max_attempts=3, backoff_base=0.01)) as client:
        with pytest.raises(ServiceUnavailable) as caught:
            await client.nodes()
    assert server.hits == 3 and caught.value.status == 503


async def test_a_retry_after_beyond_the_limit_is_raised_at_once() -> None:
    server = Flaky(failures=100, status=429, code="RATE_LIMITED", retry_after="3600")
    async with client_for(server.app) as client:
        with pytest.raises(RateLimited) as caught:
            await client.nodes()
    assert server.hits == 1 and caught.value.retry_after == 3600


async def test_client_errors_are_not_retried() -> None:
    server = Flaky(failures=100, status=422, code="VALIDATION_ERROR")
    async with client_for(server.app) as client:
        with pytest.raises(ValidationError):
            await client.invoke("onnx_cpu", "https://models.example/model.onnx")
    assert server.hits == 1


async def test_no_capacity_is_retried_only_when_the_policy_says_so() -> None:
    server = Flaky(failures=2, code="NO_CAPACITY")
    async with client_for(server.app) as client:
        with pytest.raises(NoCapacity):
            await client.invoke("onnx_cpu", "https://models.example/model.onnx")
    assert server.hits == 1
    patient = RetryPolicy(backoff_base=0.01, retry_no_capacity=True)
    async with client_for(server.app, patient) as client:
        assert (await client.invoke("onnx_cpu", "https://m.example/model.onnx")).id == "inv_flaky"
    assert server.hits == 3


@pytest.mark.parametrize("code", sorted(API_ERRORS))
async def test_every_error_code_arrives_as_its_own_class(code: str) -> None:
    server = Flaky(failures=100, status=http_status(code), code=code, retry_after=None)
    async with client_for(server.app, RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(API_ERRORS[code]) as caught:
            await client.nodes()
    error = caught.value
    assert type(error) is API_ERRORS[code]
    assert (error.status, error.code, error.message) == (
        http_status(code),
        code,
        f"{code} on purpose",
    )


async def test_an_answer_that_is_not_gpu_shares_says_to_check_the_base_url() -> None:
    app = FastAPI()
    calls: list[str] = []

    @app.get("/{path:path}")
    async def page(path: str) -> HTMLResponse:
        calls.append(path)
        status = 502 if path.startswith("busy") else 404
        return HTMLResponse("<html>nginx</html>", status_code=status)

    async with AsyncClient("http://web.example", transport=httpx.ASGITransport(app=app)) as c:
        with pytest.raises(UnexpectedResponse, match="GPU Share server's address") as caught:
            await c.health()
    assert caught.value.status == 404 and "nginx" in caught.value.body
    async with AsyncClient(
        "http://web.example/busy", transport=httpx.ASGITransport(app=app), retry=QUICK
    ) as c:
        with pytest.raises(ServiceUnavailable):  # a proxy's 502 is retried like a 503
            await c.health()
    assert len(calls) == 1 + QUICK.max_attempts


def test_a_server_that_is_down_is_unreachable_after_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    policy = RetryPolicy(max_attempts=2, backoff_base=0.01)
    with Client(url, "gpu_sk_test", retry=policy) as c, pytest.raises(ServerUnreachable) as caught:
        c.runtimes()
    message = str(caught.value)
    assert url in message and "2 attempts" in message and "server is running" in message


class CuttingProxy:
    """Forwards TCP to `upstream`, but cuts the first artifact upload after `cut_after` bytes."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.cuts = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def to_server() -> None:
            counted = -1  # bytes of an upload seen so far; -1: no upload on this connection yet
            while data := await reader.read(65536):
                if counted < 0 and self.cuts == 0 and b"POST /v1/artifacts" in data:
                    counted = 0
                if counted >= 0:
                    counted += len(data)
                    if counted > self.cut_after:
                        self.cuts += 1
                        break
                up_writer.write(data)
                await up_writer.drain()

        async def to_client() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()

        sending = asyncio.create_task(to_server())
        receiving = asyncio.create_task(to_client())
        await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sending, receiving):
            task.cancel()
        for stream in (writer, up_writer):
            stream.close()
            with contextlib.suppress(Exception):
                await stream.wait_closed()


@contextlib.asynccontextmanager
async def proxy(upstream: str, cut_after: int) -> AsyncIterator[tuple[str, CuttingProxy]]:
    cutter = CuttingProxy(httpx.URL(upstream).port or 80, cut_after)
    server = await asyncio.start_server(cutter.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", cutter
    finally:
        server.close()


async def test_an_interrupted_upload_is_sent_again_from_the_first_byte(
    app: FastAPI, tenant: TenantHandle
) -> None:
    data = npz_bytes(x=np.tile(np.arange(256, dtype=np.uint8), 12 * 1024))  # 3 MiB
    async with (
        serve(app, lifespan=False) as base_url,
        proxy(base_url, 1 << 20) as (url, cutter),
        AsyncClient(url, tenant.key, retry=QUICK) as client,
    ):
        artifact = await client.upload_artifact(data, "inputs")
        listed = await client.artifacts()
    assert cutter.cuts == 1
    assert artifact.size == len(data)
    assert [a.id for a in listed.items] == [artifact.id]  # the cut attempt stored nothing
