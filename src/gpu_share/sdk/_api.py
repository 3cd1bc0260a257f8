"""The tenant API as flows (see `_http`): each call written once for both clients.

A flow builds its request from the protocol models the coordinator itself uses,
lets `_http.send` retry and map errors, and parses the answer into those models.
"""

import base64
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypedDict, TypeVar, cast
from urllib.parse import quote as url_quote

import pydantic

from gpu_share.protocol.artifacts import UPLOADABLE_KINDS, Artifact, ArtifactKind
from gpu_share.protocol.billing import Balance, Quote, Usage, UsageGroup
from gpu_share.protocol.common import Page
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.health import Health
from gpu_share.protocol.invokes import (
    Invoke,
    InvokeCreate,
    InvokeStatus,
    OutputsUpload,
    Priority,
    ProbeUrlRequest,
    ProbeUrlResult,
)
from gpu_share.protocol.nodes import Node, RuntimeAvailability, Tier
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.spending_limits import SpendingLimits, SpendingLimitsUpdate
from gpu_share.sdk import _npz, _progress, _sources
from gpu_share.sdk._config import POLL_BACKOFF, ClientConfig
from gpu_share.sdk._http import ApiRequest, Flow, Offload, Sleep, parse, parse_list, send
from gpu_share.sdk._results import InvokeOutputs
from gpu_share.sdk.errors import (
    GpuShareError,
    InvokeCanceled,
    InvokeFailed,
    InvokeTimedOut,
    WaitTimeout,
    api_error,
)

log = logging.getLogger("gpu_share.sdk")
B = TypeVar("B", bound=pydantic.BaseModel)

# An artifact about to expire is uploaded again rather than reused: the invoke that
# names it may sit in a queue for a while before its node downloads it.
REUSE_MIN_REMAINING = timedelta(hours=1)
LOG_TAIL_LINES = 20
MAX_LONG_POLL_SEC = 60.0  # the most `GET /v1/gpu/invokes/{id}?wait=` may hold
RETURNS_ARRAYS = "invoke_and_wait (it returns the outputs as arrays)"
WITHOUT_NUMPY = "or, without numpy: invoke(), wait() and outputs(…).raw (the NPZ's bytes)"


class InvokeOptions(TypedDict, total=False):
    """The optional fields of `POST /v1/gpu/invoke` (see `InvokeCreate`), and its key."""

    timeout_sec: int
    model_checksum_sha256: str
    inputs_checksum_sha256: str
    outputs_upload: OutputsUpload | Mapping[str, Any]
    priority: Priority | str
    max_price_per_gpu_hour: Decimal | float | str
    min_vram_gb: float
    gpu_model: str
    gpus: int
    region: str
    tier: Tier | str
    webhook_url: str
    max_cost: Decimal | str | int
    reservation_id: str  # run in this active dedicated reservation of yours
    require_verified: bool  # only on nodes whose hardware challenges proved it (docs/trust.md)
    idempotency_key: str


@dataclass(frozen=True)
class LogPage:
    text: str
    cursor: int  # pass back as `after` for what comes next
    status: InvokeStatus  # the invoke's status when this page was read


StatusCallback = Callable[[Invoke], None]
ArraysOrFile = _sources.FileSource | Mapping[str, Any] | Any  # Any: a numpy array


def _id(value: str) -> str:
    return url_quote(value, safe="")


def health(c: ClientConfig) -> Flow[Health]:
    # A degraded server answers 503 with a Health body: that is an answer, not an error,
    # and not worth a retry either.
    request = ApiRequest("GET", "/health", answers=frozenset({503}), safe=True)
    response = yield from send(request, c)
    return parse(response, Health)


def nodes(c: ClientConfig) -> Flow[list[Node]]:
    response = yield from send(ApiRequest("GET", "/v1/nodes"), c)
    return parse_list(response, Node)


def runtimes(c: ClientConfig) -> Flow[list[RuntimeAvailability]]:
    response = yield from send(ApiRequest("GET", "/v1/gpu/runtimes"), c)
    return parse_list(response, RuntimeAvailability)


def probe_url(c: ClientConfig, url: str) -> Flow[ProbeUrlResult]:
    body = ProbeUrlRequest(url=url).model_dump()
    response = yield from send(ApiRequest("POST", "/v1/gpu/probe-url", json=body), c)
    return parse(response, ProbeUrlResult)


E = TypeVar("E", bound=StrEnum)


def _choice(cls: type[E], value: E | str, field: str, allowed: Iterable[E] | None = None) -> E:
    """A refusal that names the field, before a request the server would refuse is sent."""
    options = list(allowed if allowed is not None else cls)
    try:
        chosen = cls(value)
    except ValueError:
        chosen = None
    if chosen is None or chosen not in options:
        names = ", ".join(option.value for option in options)
        raise api_error(None, ErrorCode.VALIDATION_ERROR, f"{field}: must be one of {names}")
    return chosen


def _kind(kind: ArtifactKind | str) -> ArtifactKind:
    return _choice(ArtifactKind, kind, "kind", UPLOADABLE_KINDS)


def list_artifacts(
    c: ClientConfig,
    *,
    kind: ArtifactKind | str | None = None,
    sha256: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Flow[Page[Artifact]]:
    params: dict[str, str | int] = {"limit": limit}
    if kind is not None:
        params["kind"] = _choice(ArtifactKind, kind, "kind").value
    if sha256 is not None:
        params["sha256"] = sha256
    if cursor is not None:
        params["cursor"] = cursor
    response = yield from send(ApiRequest("GET", "/v1/artifacts", params=params), c)
    return parse(response, Page[Artifact])


def find_artifact(
    c: ClientConfig, sha256: str, kind: ArtifactKind, name: str | None = None
) -> Flow[Artifact | None]:
    """A live artifact of yours with these bytes, far enough from expiry to be worth reusing:
    one under `name` if there is one, else any (which keeps the name it was uploaded under)."""
    page = yield from list_artifacts(c, kind=kind, sha256=sha256, limit=10)
    soon = datetime.now(UTC) + REUSE_MIN_REMAINING
    live = [artifact for artifact in page.items if artifact.expires_at > soon]
    named = [artifact for artifact in live if name is not None and artifact.name == name]
    return next(iter(named or live), None)


def upload_artifact(
    c: ClientConfig,
    source: _sources.FileSource,
    kind: ArtifactKind | str,
    *,
    reuse: bool = True,
    name: str | None = None,
) -> Flow[Artifact]:
    kind = _kind(kind)
    prepared: _sources.UploadSource = yield Offload(lambda: _sources.prepare(source, name))
    try:
        if reuse:
            found = yield from find_artifact(c, prepared.sha256, kind, prepared.filename)
            if found is not None:
                log.info("reusing %s: same bytes as %s", found.id, prepared.name)
                return found
        line = _progress.ProgressLine() if _progress.enabled(c.progress) else None
        if line is not None:
            prepared.on_progress = lambda sent: line.show(
                _progress.upload_line(prepared.name, sent, prepared.size)
            )
        params = {"kind": kind.value, "content_sha256": prepared.sha256}
        if prepared.filename is not None:
            params["name"] = prepared.filename
        request = ApiRequest("POST", "/v1/artifacts", params=params, upload=prepared)
        try:
            response = yield from send(request, c)
        except BaseException:
            if line is not None:
                line.done()
            raise
        if line is not None:
            line.done(_progress.upload_line(prepared.name, prepared.size, prepared.size))
        return parse(response, Artifact)
    finally:
        prepared.close()


def delete_artifact(c: ClientConfig, artifact_id: str) -> Flow[None]:
    yield from send(ApiRequest("DELETE", f"/v1/artifacts/{_id(artifact_id)}"), c)


def build_invoke(
    runtime: RuntimeName | str, model_url: str, inputs_url: str | None, options: InvokeOptions
) -> tuple[dict[str, Any], str]:
    """The JSON body, validated by the coordinator's own model before it is sent, and the
    Idempotency-Key that makes sending it again safe."""
    fields: dict[str, Any] = {k: v for k, v in options.items() if k != "idempotency_key"}
    body = validated(
        InvokeCreate,
        {"runtime": runtime, "model_url": model_url, "inputs_url": inputs_url or "", **fields},
    )
    key = options.get("idempotency_key") or f"sdk-{uuid.uuid4().hex}"
    # require_verified left out when false: a coordinator from before it accepts the body.
    unset = None if body.require_verified else {"require_verified"}
    return body.model_dump(mode="json", exclude_none=True, exclude=unset), key


def validated(model: type[B], fields: Mapping[str, Any]) -> B:
    """The body checked with the server's own model: a bad one never leaves the machine."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as exc:
        details = [{"loc": [str(p) for p in err["loc"]], "msg": err["msg"]} for err in exc.errors()]
        summary = "; ".join(f"{'.'.join(d['loc']) or 'body'}: {d['msg']}" for d in details[:5])
        raise api_error(None, ErrorCode.VALIDATION_ERROR, summary, details) from None


def invoke(
    c: ClientConfig,
    runtime: RuntimeName | str,
    model_url: str,
    inputs_url: str | None = "",
    options: InvokeOptions | None = None,
    *,
    wait: float = 0.0,
) -> Flow[Invoke]:
    """Queue the invoke. With `wait` ≥ 1 the server is asked (`Prefer: wait=N`, whole
    seconds up to a minute) to answer with the finished invoke if it ends that soon; a
    server that does not, or an invoke still running, answers it queued or running."""
    body, key = build_invoke(runtime, model_url, inputs_url, options or {})
    headers = {"Idempotency-Key": key}
    held = int(min(wait, MAX_LONG_POLL_SEC))
    if held >= 1:
        headers["Prefer"] = f"wait={held}"
    request = ApiRequest(
        "POST",
        "/v1/gpu/invoke",
        json=body,
        headers=headers,
        read_timeout=held + c.timeout if held >= 1 else None,
    )
    response = yield from send(request, c)
    return parse(response, Invoke)


def quote(
    c: ClientConfig,
    runtime: RuntimeName | str,
    model_url: str,
    inputs_url: str | None = "",
    options: InvokeOptions | None = None,
) -> Flow[Quote]:
    """What `invoke` with the same arguments would cost now; nothing is queued."""
    body, _ = build_invoke(runtime, model_url, inputs_url, options or {})
    response = yield from send(ApiRequest("POST", "/v1/gpu/quote", json=body), c)
    return parse(response, Quote)


def balance(c: ClientConfig) -> Flow[Balance]:
    response = yield from send(ApiRequest("GET", "/v1/billing/balance"), c)
    return parse(response, Balance)


def usage(
    c: ClientConfig,
    *,
    start: str | None = None,
    end: str | None = None,
    group: UsageGroup | str = UsageGroup.DAY,
) -> Flow[Usage]:
    params = {"group": _choice(UsageGroup, group, "group").value}
    params.update({k: v for k, v in {"from": start, "to": end}.items() if v is not None})
    response = yield from send(ApiRequest("GET", "/v1/billing/usage", params=params), c)
    return parse(response, Usage)


def spending_limits(c: ClientConfig) -> Flow[SpendingLimits]:
    response = yield from send(ApiRequest("GET", "/v1/billing/limits"), c)
    return parse(response, SpendingLimits)


def set_spending_limits(
    c: ClientConfig,
    *,
    monthly_cap: Decimal | str | int | None,
    low_balance: Decimal | str | int | None,
) -> Flow[SpendingLimits]:
    body = validated(SpendingLimitsUpdate, {"monthly_cap": monthly_cap, "low_balance": low_balance})
    request = ApiRequest("PUT", "/v1/billing/limits", json=body.model_dump(mode="json"))
    response = yield from send(request, c)
    return parse(response, SpendingLimits)


def get_invoke(c: ClientConfig, invoke_id: str, wait: float = 0.0) -> Flow[Invoke]:
    """With `wait` > 0 a long-poll: the server answers as soon as the invoke is final, or
    after `wait` seconds as it is then; the read timeout is stretched to outlast it."""
    path = f"/v1/gpu/invokes/{_id(invoke_id)}"
    request = ApiRequest("GET", path)
    if wait > 0:
        held = round(min(max(wait, 0.001), MAX_LONG_POLL_SEC), 3)
        request = ApiRequest("GET", path, params={"wait": held}, read_timeout=held + c.timeout)
    response = yield from send(request, c)
    return parse(response, Invoke)


def list_invokes(
    c: ClientConfig,
    *,
    status: InvokeStatus | str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Flow[Page[Invoke]]:
    params: dict[str, str | int] = {"limit": limit}
    if status is not None:
        params["status"] = _choice(InvokeStatus, status, "status").value
    if cursor is not None:
        params["cursor"] = cursor
    response = yield from send(ApiRequest("GET", "/v1/gpu/invokes", params=params), c)
    return parse(response, Page[Invoke])


def cancel(c: ClientConfig, invoke_id: str) -> Flow[Invoke]:
    # Safe to repeat: canceling a canceled invoke answers it again.
    request = ApiRequest("POST", f"/v1/gpu/invokes/{_id(invoke_id)}/cancel")
    response = yield from send(request, c)
    return parse(response, Invoke)


def logs_page(c: ClientConfig, invoke_id: str, after: int = 0) -> Flow[LogPage]:
    request = ApiRequest("GET", f"/v1/gpu/invokes/{_id(invoke_id)}/logs", params={"after": after})
    response = yield from send(request, c)
    try:
        cursor = int(response.headers.get("x-log-cursor", after))
        status = InvokeStatus(response.headers.get("x-invoke-status", ""))
    except ValueError:
        raise GpuShareError(
            f"{response.request.url} answered without the log headers of a GPU Share server"
        ) from None
    return LogPage(response.text, cursor, status)


def logs(c: ClientConfig, invoke_id: str) -> Flow[str]:
    pieces: list[str] = []
    after = 0
    while True:
        page = yield from logs_page(c, invoke_id, after)
        if not page.text or page.cursor == after:
            return "".join(pieces)
        pieces.append(page.text)
        after = page.cursor


def logs_tail(c: ClientConfig, invoke_id: str, lines: int = LOG_TAIL_LINES) -> Flow[str]:
    """The end of the log for an error message; an error message is no place for another error."""
    try:
        text = yield from logs(c, invoke_id)
    except GpuShareError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def wait(
    c: ClientConfig,
    invoke: Invoke | str,
    timeout: float | None = None,
    *,
    poll_interval: float | None = None,
    max_poll_interval: float | None = None,
    on_status: StatusCallback | None = None,
) -> Flow[Invoke]:
    """Follow the invoke to its end with the server's long-poll (`?wait=`): each request
    comes back the moment the invoke is final, else after its window with the status
    then (for `on_status` and the progress line). The window starts at `poll_interval`
    and grows ×1.5 up to the cap (5 s to 10 s by default), never past `timeout`.

    Given an `Invoke` rather than an id (what `invoke` just answered), the wait starts
    from it rather than asking for it again.
    """
    invoke_id = invoke if isinstance(invoke, str) else invoke.id
    window = poll_interval if poll_interval is not None else c.poll_interval
    cap = max(window, max_poll_interval if max_poll_interval is not None else c.max_poll_interval)
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    line = _progress.ProgressLine() if _progress.enabled(c.progress) else None
    last: InvokeStatus | None = None
    try:
        current = invoke if isinstance(invoke, Invoke) else (yield from get_invoke(c, invoke_id))
        while True:
            changed = current.status is not last
            if changed:
                last = current.status
                if on_status is not None:
                    on_status(current)
            if line is not None:
                waited = time.monotonic() - started
                line.show(f"{invoke_id}: {current.status.value} ({waited:.0f} s)", force=changed)
            if current.status.terminal:
                break
            held = min(window, MAX_LONG_POLL_SEC)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(invoke_id, time.monotonic() - started, current.status.value)
                held = min(held, remaining)
            asked = time.monotonic()
            current = yield from get_invoke(c, invoke_id, wait=held)
            early = held - (time.monotonic() - asked)
            if early > 0 and not current.status.terminal:
                # Answered before the window ended and not final: a server without
                # `?wait=` (or one shutting down). Pause as a plain poll would.
                yield Sleep(early)
            window = min(cap, window * POLL_BACKOFF)
    finally:
        if line is not None:
            line.done()
    if current.status is InvokeStatus.DONE:
        return current
    tail = yield from logs_tail(c, invoke_id)
    raise failure_of(current, tail)


def failure_of(invoke: Invoke, logs_tail: str = "") -> InvokeFailed:
    if invoke.status is InvokeStatus.TIMEOUT:
        return InvokeTimedOut(invoke, logs_tail)
    if invoke.status is InvokeStatus.CANCELED:
        return InvokeCanceled(invoke, logs_tail)
    return InvokeFailed(invoke, logs_tail)


def outputs(c: ClientConfig, invoke: Invoke) -> Flow[InvokeOutputs]:
    """The outputs of a done invoke: inline, or fetched from the platform with your key."""
    if invoke.status is not InvokeStatus.DONE or invoke.result is None:
        raise GpuShareError(f"invoke {invoke.id} is {invoke.status.value}; it has no outputs")
    result = invoke.result
    if result.outputs_inline_base64 is not None:
        raw: bytes | None = base64.b64decode(result.outputs_inline_base64)
    elif result.outputs_url and c.same_origin(result.outputs_url):
        response = yield from send(ApiRequest("GET", result.outputs_url), c)
        raw = response.content
    else:
        raw = None  # the tenant's own storage: only the tenant can read it
    if raw is not None and result.outputs_sha256:
        actual = hashlib.sha256(raw).hexdigest()
        if actual != result.outputs_sha256:
            raise api_error(
                None,
                ErrorCode.CHECKSUM_MISMATCH,
                f"the outputs of {invoke.id} arrived with SHA-256 {actual}, "
                f"not {result.outputs_sha256}; fetch them again",
            )
    return InvokeOutputs(invoke, raw)


def model_kind(runtime: RuntimeName | str) -> ArtifactKind:
    """The kind a job's model is uploaded as: a CatBoost training's is its train config."""
    try:
        return RuntimeName(runtime).model_kind
    except ValueError:
        return ArtifactKind.MODEL  # the server names the unknown runtime


def stage(
    c: ClientConfig, source: ArraysOrFile, kind: ArtifactKind
) -> Flow[tuple[str, str | None]]:
    """A URL and its SHA-256 for a model (or train config) or inputs given as a URL, file,
    bytes or arrays."""
    if source is None or (isinstance(source, str) and not source):
        if kind is not ArtifactKind.INPUTS:
            raise api_error(None, ErrorCode.VALIDATION_ERROR, "model: a model is required")
        return "", None
    if _sources.is_url(source):
        return str(source), None
    if kind is ArtifactKind.INPUTS and _npz.is_array_like(source):
        arrays: Any = source
        data: bytes = yield Offload(lambda: _npz.encode(arrays))
        artifact = yield from upload_artifact(c, data, kind, name="inputs.npz")
    else:
        artifact = yield from upload_artifact(c, cast(_sources.FileSource, source), kind)
    return artifact.url, artifact.sha256


def invoke_and_wait(
    c: ClientConfig,
    runtime: RuntimeName | str,
    model: ArraysOrFile,
    inputs: ArraysOrFile = None,
    options: InvokeOptions | None = None,
    *,
    wait_timeout: float | None = None,
    poll_interval: float | None = None,
    on_status: StatusCallback | None = None,
) -> Flow[InvokeOutputs]:
    # The outputs come back as arrays: without numpy, say so before uploading anything.
    yield Offload(lambda: _npz.require_numpy(RETURNS_ARRAYS, instead=WITHOUT_NUMPY))
    options = InvokeOptions(**(options or {}))
    model_url, model_sha = yield from stage(c, model, model_kind(runtime))
    inputs_url, inputs_sha = yield from stage(c, inputs, ArtifactKind.INPUTS)
    if model_sha and "model_checksum_sha256" not in options:
        options["model_checksum_sha256"] = model_sha
    if inputs_sha and "inputs_checksum_sha256" not in options:
        options["inputs_checksum_sha256"] = inputs_sha
    # The submit itself holds for the first window: a short job comes back finished
    # in this one answer, with no status request after it.
    window = poll_interval if poll_interval is not None else c.poll_interval
    if wait_timeout is not None:
        window = min(window, wait_timeout)
    queued = yield from invoke(c, runtime, model_url, inputs_url, options, wait=window)
    log.info("invoke %s %s", queued.id, queued.status.value)
    final = yield from wait(
        c, queued, wait_timeout, poll_interval=poll_interval, on_status=on_status
    )
    return (yield from outputs(c, final))
