"""The transport under both clients: steps, retries, error mapping and two drivers.

Every API call is written once, as a generator (a *flow*) that yields steps and
receives their results, the way httpx writes its auth flows. A flow does no I/O:
it yields `Exchange` (send one request), `Sleep` or `Offload` (blocking work such
as hashing a file), and a driver performs the step. `SyncDriver` uses
`httpx.Client` and `time.sleep`; `AsyncDriver` uses `httpx.AsyncClient`,
`asyncio.sleep` and a worker thread. So retries, uploads and waiting exist once,
and `Client` and `AsyncClient` differ only in which driver runs the flow.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pydantic

from gpu_share.protocol.errors import ErrorCode, ErrorResponse
from gpu_share.sdk._config import ClientConfig, RetryPolicy, parse_retry_after
from gpu_share.sdk._sources import UploadSource
from gpu_share.sdk.errors import (
    ApiError,
    ServerUnreachable,
    ServiceUnavailable,
    UnexpectedResponse,
    api_error,
)

log = logging.getLogger("gpu_share.sdk")

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str  # relative to the base URL, or an absolute URL of the same server
    params: Mapping[str, str | int | float] | None = None
    json: Any = None
    upload: UploadSource | None = None
    content: bytes | None = None  # a small body sent as is (session forwards)
    headers: Mapping[str, str] = field(default_factory=dict)
    safe: bool = True  # may be sent again: retried on transport errors, 429 and 5xx
    answers: frozenset[int] = frozenset()  # non-2xx statuses that are answers, not errors
    read_timeout: float | None = None  # instead of the client's: for a long-poll the server holds


@dataclass(frozen=True)
class Exchange:
    """Send one request; the driver answers with an `httpx.Response` or the
    `httpx.TransportError` that prevented one."""

    request: ApiRequest


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Offload:
    """Blocking work (hashing, NPZ encoding, loading a model): off the event loop when async."""

    work: Callable[[], Any]


Step = Exchange | Sleep | Offload
Flow = Generator[Step, Any, T]


def send(request: ApiRequest, config: ClientConfig) -> Flow[httpx.Response]:
    """One request with the retries `config.retry` allows; raises the mapped error."""
    policy = config.retry
    attempt = 0
    while True:
        attempt += 1
        outcome = yield Exchange(request)
        if isinstance(outcome, httpx.Response):
            if outcome.is_success or outcome.status_code in request.answers:
                return outcome
            refusal = error_from(outcome, config)
            error: ApiError | ServerUnreachable = refusal
            pause = _retry_pause(request, policy, attempt, refusal)
        else:
            error = unreachable(outcome, request, config, attempt)
            pause = policy.pause(attempt, None) if request.safe else None
        if pause is None:
            raise error
        log.info(
            "%s %s: %s; attempt %d of %d in %.1f s",
            request.method,
            request.path,
            error,
            attempt + 1,
            policy.max_attempts,
            pause,
        )
        yield Sleep(pause)


def _retry_pause(
    request: ApiRequest, policy: RetryPolicy, attempt: int, error: ApiError
) -> float | None:
    if not request.safe or error.status not in policy.statuses:
        return None
    if error.code == ErrorCode.NO_CAPACITY and not policy.retry_no_capacity:
        return None
    return policy.pause(attempt, error.retry_after)


def error_from(response: httpx.Response, config: ClientConfig) -> ApiError:
    """Rebuild the server's error; an answer in another shape is not GPU Share's."""
    retry_after = parse_retry_after(response.headers)
    try:
        body = ErrorResponse.model_validate_json(response.content)
    except pydantic.ValidationError:
        if response.status_code in (502, 503, 504):  # a proxy in front of a busy server
            return ServiceUnavailable(
                f"{response.request.url} answered HTTP {response.status_code} "
                f"({response.reason_phrase}) from something in front of the server",
                status=response.status_code,
                code=ErrorCode.UNAVAILABLE,
                retry_after=retry_after,
            )
        raise UnexpectedResponse(
            f"{response.request.url} answered HTTP {response.status_code} with "
            f"{response.headers.get('content-type', 'no content type')}, not a GPU Share "
            f"error; is {config.base_url} the GPU Share server's address?",
            status=response.status_code,
            url=str(response.request.url),
            body=response.text[:2000],
        ) from None
    error = body.error
    message = error.message
    if response.status_code == 401 and not config.api_key:
        message += " (no API key was given: pass api_key= / --api-key or set GPU_SHARE_API_KEY)"
    return api_error(response.status_code, error.code, message, error.details, retry_after)


def unreachable(
    exc: httpx.TransportError, request: ApiRequest, config: ClientConfig, attempts: int
) -> ServerUnreachable:
    url = str(exc.request.url) if _has_request(exc) else config.base_url + request.path
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    reason = str(exc) or type(exc).__name__
    return ServerUnreachable(
        f"cannot reach the GPU Share server: {request.method} {url} {kind}{tries}: "
        f"{reason}; check the base URL ({config.base_url}), your network, and that the "
        "server is running",
        url=url,
        reason=reason,
    )


def _has_request(exc: httpx.TransportError) -> bool:
    try:
        exc.request  # noqa: B018 (raises RuntimeError when httpx never built one)
    except RuntimeError:
        return False
    return True


def parse(response: httpx.Response, model: type[M]) -> M:
    try:
        return model.model_validate_json(response.content)
    except pydantic.ValidationError as exc:
        raise UnexpectedResponse(
            f"{response.request.url} answered in a shape this SDK does not know "
            f"({model.__name__}: {exc.errors()[0]['msg']}); is the server a GPU Share "
            "server of a compatible version?",
            status=response.status_code,
            url=str(response.request.url),
            body=response.text[:2000],
        ) from None


def parse_list(response: httpx.Response, model: type[M]) -> list[M]:
    adapter = pydantic.TypeAdapter(list[model])  # type: ignore[valid-type]
    try:
        items: list[M] = adapter.validate_json(response.content)
    except pydantic.ValidationError as exc:
        raise UnexpectedResponse(
            f"{response.request.url} answered in a shape this SDK does not know "
            f"(list of {model.__name__}: {exc.errors()[0]['msg']})",
            status=response.status_code,
            url=str(response.request.url),
            body=response.text[:2000],
        ) from None
    return items


def _build(http: httpx.Client | httpx.AsyncClient, req: ApiRequest, content: Any) -> httpx.Request:
    headers = dict(req.headers)
    if req.content is not None:
        content = req.content
    if req.upload is not None:
        headers["Content-Type"] = "application/octet-stream"
        headers["Content-Length"] = str(req.upload.size)  # lets the server refuse early
    timeout = http.timeout
    if req.read_timeout is not None:
        timeout = httpx.Timeout(
            connect=timeout.connect, read=req.read_timeout, write=timeout.write, pool=timeout.pool
        )
    return http.build_request(
        req.method,
        req.path,
        params=dict(req.params) if req.params else None,
        json=req.json,
        content=content,
        headers=headers,
        timeout=timeout,
    )


class SyncDriver:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def run(self, flow: Flow[T]) -> T:
        reply: Any = None
        failure: BaseException | None = None
        try:
            while True:
                try:
                    step = flow.throw(failure) if failure is not None else flow.send(reply)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
                reply, failure = None, None
                try:
                    reply = self._perform(step)
                except Exception as exc:  # handed back to the flow, which may handle it
                    failure = exc
        finally:
            flow.close()

    def _perform(self, step: Step) -> Any:
        if isinstance(step, Exchange):
            return self._exchange(step.request)
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        return step.work()

    def _exchange(self, req: ApiRequest) -> httpx.Response | httpx.TransportError:
        content: Iterator[bytes] | None = req.upload.chunks() if req.upload else None
        try:
            return self.http.send(_build(self.http, req, content))
        except httpx.TransportError as exc:
            return exc


class AsyncDriver:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def run(self, flow: Flow[T]) -> T:
        reply: Any = None
        failure: BaseException | None = None
        try:
            while True:
                try:
                    step = flow.throw(failure) if failure is not None else flow.send(reply)
                except StopIteration as stop:
                    result: T = stop.value
                    return result
                reply, failure = None, None
                try:
                    reply = await self._perform(step)
                except Exception as exc:
                    failure = exc
        finally:
            flow.close()

    async def _perform(self, step: Step) -> Any:
        if isinstance(step, Exchange):
            return await self._exchange(step.request)
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        return await asyncio.to_thread(step.work)

    async def _exchange(self, req: ApiRequest) -> httpx.Response | httpx.TransportError:
        content: AsyncIterator[bytes] | None = req.upload.achunks() if req.upload else None
        try:
            return await self.http.send(_build(self.http, req, content))
        except httpx.TransportError as exc:
            return exc
