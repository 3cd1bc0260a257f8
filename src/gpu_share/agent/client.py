"""The agent's HTTP client for the coordinator, with backoff through outages.

Transport errors, 5xx and 429 are transient: `call(..., retry_for=...)` keeps trying
with capped exponential backoff. 409 on a leased invoke means the lease is stale
(`StaleLease`): the job belongs to someone else now.
"""

import asyncio
import hashlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from gpu_share._version import __version__
from gpu_share.backoff import Backoff
from gpu_share.protocol import agent as wire
from gpu_share.protocol import benchmarks as bench
from gpu_share.protocol import trust

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
# A challenge's calls are repeatable (the coordinator answers a repeat as the first time)
# and race a deadline: retried through short outages only.
CHALLENGE_RETRY_SEC = 20.0


class CoordinatorError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class StaleLease(CoordinatorError):
    """The coordinator no longer considers this agent the holder of the lease."""


class Unauthorized(CoordinatorError):
    """The node key or enrollment token is not accepted."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, CoordinatorError) and (exc.status >= 500 or exc.status == 429)


def describe(exc: BaseException) -> str:
    """Why a request failed, in a few words: "connection refused", "timed out", "503 …"."""
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    cause: BaseException | None = exc if isinstance(exc, httpx.TransportError) else None
    while cause is not None:  # httpx wraps the OSError that says what happened
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve the host name ({cause.strerror})"
        if isinstance(cause, OSError) and cause.errno is not None:
            return os.strerror(cause.errno).lower()
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except Exception:
        code, message = "HTTP_ERROR", response.text[:300]
    cls = {401: Unauthorized, 409: StaleLease}.get(response.status_code, CoordinatorError)
    raise cls(response.status_code, code, message)


async def _retrying(
    what: str,
    send: Callable[[], Awaitable[httpx.Response]],
    *,
    retry_for: float,
    delay: Backoff,
) -> httpx.Response:
    """`send()` until it succeeds, fails for good, or `retry_for` seconds are spent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_for
    while True:
        try:
            return await send()
        except Exception as exc:
            if not is_transient(exc) or loop.time() + delay.upcoming > deadline:
                raise
            log.info("%s failed (%s); retrying in %.1fs", what, describe(exc), delay.upcoming)
            await delay.sleep()


class CoordinatorClient:
    def __init__(
        self,
        server: str,
        *,
        key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.key = key
        self._http = httpx.AsyncClient(
            base_url=self.server,
            transport=transport,
            timeout=httpx.Timeout(30.0, connect=10.0),
            headers={"User-Agent": f"gpu-share-agent/{__version__}"},
            trust_env=False,
        )

    def _auth(self, key: str | None = None) -> dict[str, str]:
        secret = key or self.key
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        key: str | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        content: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        response = await self._http.request(
            method,
            path,
            json=json,
            content=content,
            params=params,
            headers={**self._auth(key), **(headers or {})},
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        _raise_for(response)
        return response

    async def call(
        self,
        method: str,
        path: str,
        answer: type[M] | None = None,
        *,
        retry_for: float = 0.0,
        **kwargs: Any,
    ) -> M | None:
        """One request; transient failures are retried for up to `retry_for` seconds."""
        response = await _retrying(
            f"{method} {path}",
            lambda: self._request(method, path, **kwargs),
            retry_for=retry_for,
            delay=Backoff(first=0.2, cap=10.0),
        )
        if answer is None or response.status_code == 204:
            return None
        return answer.model_validate(response.json())

    async def register(
        self, token: str, inventory: wire.NodeInventory, *, retry_for: float = 60.0
    ) -> wire.RegistrationResult:
        result = await self.call(
            "POST",
            "/v1/agent/register",
            wire.RegistrationResult,
            json=wire.Registration(inventory=inventory).model_dump(mode="json"),
            key=token,
            retry_for=retry_for,
        )
        assert result is not None
        return result

    async def update_inventory(
        self, inventory: wire.NodeInventory, *, retry_for: float = 60.0
    ) -> wire.InventoryAck:
        ack = await self.call(
            "PUT",
            "/v1/agent/inventory",
            wire.InventoryAck,
            json=inventory.model_dump(mode="json"),
            retry_for=retry_for,
        )
        assert ack is not None
        return ack

    async def heartbeat(self, beat: wire.Heartbeat) -> wire.HeartbeatAck:
        ack = await self.call(
            "POST", "/v1/agent/heartbeat", wire.HeartbeatAck, json=beat.model_dump(mode="json")
        )
        assert ack is not None
        return ack

    async def lease(self, request: wire.LeaseRequest) -> wire.LeaseResponse:
        response = await self.call(
            "POST",
            "/v1/agent/lease",
            wire.LeaseResponse,
            json=request.model_dump(mode="json"),
            timeout=request.wait_sec + wire.LEASE_ANSWER_SLACK_SEC,
        )
        assert response is not None
        return response

    async def start(self, invoke_id: str, lease_token: str) -> None:
        await self.call(
            "POST",
            f"/v1/agent/invokes/{invoke_id}/start",
            json=wire.StartReport(lease_token=lease_token).model_dump(),
            retry_for=60.0,
        )

    async def append_logs(self, invoke_id: str, lease_token: str, text: str) -> wire.LeaseVerdict:
        ack = await self.call(
            "POST",
            f"/v1/agent/invokes/{invoke_id}/logs",
            wire.LogAck,
            json=wire.LogAppend(lease_token=lease_token, text=text).model_dump(),
        )
        assert ack is not None
        return ack.verdict

    async def store_outputs(
        self, invoke_id: str, lease_token: str, path: Path, sha256: str
    ) -> wire.OutputsStored:
        """Stream a large result to platform storage; the coordinator re-checks the hash."""
        response = await self._stream_file(
            f"/v1/agent/invokes/{invoke_id}/outputs", lease_token, path, sha256
        )
        return wire.OutputsStored.model_validate(response.json())

    async def store_checkpoint(
        self, invoke_id: str, lease_token: str, path: Path, sha256: str
    ) -> wire.CheckpointStored:
        response = await self._stream_file(
            f"/v1/agent/invokes/{invoke_id}/checkpoint", lease_token, path, sha256
        )
        return wire.CheckpointStored.model_validate(response.json())

    async def _stream_file(
        self, endpoint: str, lease_token: str, path: Path, sha256: str
    ) -> httpx.Response:
        """POST a file as the body, re-sent from the start after transient failures."""

        async def body() -> AsyncIterator[bytes]:
            with path.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, 1 << 20):
                    yield chunk

        return await _retrying(
            f"POST {endpoint}",
            lambda: self._request(
                "POST",
                endpoint,
                content=body(),
                params={"content_sha256": sha256},
                headers={
                    wire.LEASE_TOKEN_HEADER: lease_token,
                    "Content-Type": "application/octet-stream",
                },
                timeout=600.0,
            ),
            retry_for=600.0,
            delay=Backoff(first=0.5, cap=10.0),
        )

    async def report(
        self, invoke_id: str, report: wire.ResultReport, retry_for: float
    ) -> list[wire.LeasedJob]:
        """Report a result; the jobs leased with it when it asks `next` (none otherwise)."""
        answer = await self.call(
            "POST",
            f"/v1/agent/invokes/{invoke_id}/result",
            wire.LeaseResponse,
            json=report.model_dump(mode="json"),
            retry_for=retry_for,
        )
        return [] if answer is None else answer.jobs

    async def report_preempted(self, invoke_id: str, lease_token: str, retry_for: float) -> None:
        """The job stopped at a PREEMPT verdict: the coordinator requeues it."""
        await self.call(
            "POST",
            f"/v1/agent/invokes/{invoke_id}/preempted",
            json=wire.PreemptedReport(lease_token=lease_token).model_dump(),
            retry_for=retry_for,
        )

    async def report_benchmark(self, report: bench.BenchmarkReport) -> bench.BenchmarkRun:
        run = await self.call(
            "POST",
            "/v1/agent/benchmarks",
            bench.BenchmarkRun,
            json=report.model_dump(mode="json"),
            retry_for=300.0,
        )
        assert run is not None
        return run

    async def benchmark_ping(self) -> None:
        await self.call("GET", "/v1/agent/benchmarks/ping", timeout=10.0)

    async def benchmark_download(self, nbytes: int, seconds: float) -> int:
        """Bytes of `nbytes` zeros the coordinator sent before `seconds` ran out."""
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        async with self._http.stream(
            "GET",
            "/v1/agent/benchmarks/download",
            params={"bytes": str(nbytes)},
            headers=self._auth(),
            timeout=seconds + 10.0,
        ) as response:
            if not response.is_success:
                await response.aread()
                _raise_for(response)
            async for chunk in response.aiter_raw():
                received += len(chunk)
                if loop.time() > deadline:
                    break
        return received

    async def benchmark_upload(self, nbytes: int, seconds: float) -> int:
        """Bytes the coordinator received of up to `nbytes` sent within `seconds`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        block = bytes(1 << 20)

        async def body() -> AsyncIterator[bytes]:
            left = nbytes
            while left > 0 and loop.time() < deadline:
                yield block[: min(left, len(block))]
                left -= len(block)

        response = await self._request(
            "POST",
            "/v1/agent/benchmarks/upload",
            content=body(),
            headers={"Content-Type": "application/octet-stream"},
            timeout=seconds + 10.0,
        )
        return bench.ProbeUpload.model_validate(response.json()).received_bytes

    async def _challenge(
        self, challenge_id: str, step: str, answer: type[M], body: BaseModel | None = None
    ) -> M:
        result = await self.call(
            "POST",
            f"/v1/agent/challenges/{challenge_id}/{step}",
            answer,
            json=None if body is None else body.model_dump(mode="json"),
            retry_for=CHALLENGE_RETRY_SEC,
            timeout=120.0,
        )
        assert result is not None
        return result

    async def start_challenge(self, challenge_id: str) -> trust.ChallengeStart:
        """The seed: the commit deadline runs from the coordinator's first answer (a retry
        after a lost answer gets the same seed and deadline)."""
        return await self._challenge(challenge_id, "start", trust.ChallengeStart)

    async def commit_challenge(
        self, challenge_id: str, commit: trust.ChallengeCommit
    ) -> trust.ChallengeCommitted:
        return await self._challenge(challenge_id, "commit", trust.ChallengeCommitted, commit)

    async def reveal_challenge(
        self, challenge_id: str, reveal: trust.ChallengeReveal
    ) -> trust.ChallengeVerdict:
        return await self._challenge(challenge_id, "reveal", trust.ChallengeVerdict, reveal)

    async def download(
        self, url: str, dest: Path, *, max_bytes: int, timeout: float
    ) -> tuple[str, int]:
        """Fetch a platform artifact (a signed URL of this coordinator); returns sha256, size."""
        hasher = hashlib.sha256()
        size = 0
        partial = dest.with_name(dest.name + ".part")
        try:
            async with asyncio.timeout(timeout):
                async with self._http.stream("GET", url, timeout=timeout) as response:
                    if not response.is_success:
                        await response.aread()
                        _raise_for(response)
                    with partial.open("wb") as f:
                        async for chunk in response.aiter_bytes(1 << 20):
                            size += len(chunk)
                            if size > max_bytes:
                                raise CoordinatorError(
                                    413, "PAYLOAD_TOO_LARGE", f"artifact is over {max_bytes} bytes"
                                )
                            hasher.update(chunk)
                            await asyncio.to_thread(f.write, chunk)
            partial.replace(dest)
        finally:
            partial.unlink(missing_ok=True)
        return hasher.hexdigest(), size
