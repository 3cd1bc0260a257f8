"""The tenant's invokes in the console: list, start, follow, results, cancel.

Also what the other console pages share with these: the 404 page, the tenant of a
script's request, and how long an invoke took.
"""

import asyncio
import base64
import binascii
import secrets
from dataclasses import dataclass

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from gpu_share.coordinator.core.errors import (
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    Unauthorized,
)
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.core.principals import TenantCaller
from gpu_share.coordinator.http.artifacts import stream_download
from gpu_share.coordinator.http.replica import base_url, origins
from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.work import invokes
from gpu_share.coordinator.web.pages import Browser, BrowserDep, SignedTenant, form_of, text
from gpu_share.protocol.artifacts import Artifact, ArtifactKind
from gpu_share.protocol.invokes import Invoke, InvokeCreate, InvokeStatus
from gpu_share.protocol.runtimes import RuntimeName

router = APIRouter(prefix="/console/invokes", include_in_schema=False)

PAGE_SIZE = 25
CHOICES = 100  # artifacts offered in the New invoke form, newest first
PREVIEW_VALUES = 8
PREVIEW_MAX_BYTES = 64 * 1024 * 1024  # inline outputs expanding past this are not previewed
STATUS_TABS = ["", *(s.value for s in InvokeStatus)]


def not_found(browser: Browser, what: str) -> Response:
    return browser.render(
        "public/message.html",
        status=404,
        title="Not found",
        message=f"There is no {what} of yours with that id.",
    )


def script_tenant(browser: Browser) -> TenantCaller:
    """The tenant behind a script's request; the API's 401/403 instead of a redirect."""
    if browser.principal is None:
        raise Unauthorized("sign in at /signin first; this session ended or never began")
    if not isinstance(browser.principal, TenantCaller):
        raise Forbidden("this is for tenants")
    return browser.principal


def _ms(value: int | None) -> str:
    if value is None:
        return "—"
    return f"{value} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def took(invoke: Invoke) -> str:
    if invoke.result is not None:
        return _ms(invoke.result.metrics.duration_ms)
    if invoke.started_at and invoke.finished_at:
        return _ms(int((invoke.finished_at - invoke.started_at).total_seconds() * 1000))
    return "—"


@dataclass(frozen=True)
class InvokeForm:
    runtimes: list[str]  # those some online node serves now
    models: list[Artifact]  # ONNX models and CatBoost configs
    inputs: list[Artifact]
    max_timeout: int


async def _invoke_form(browser: Browser, tenant: TenantCaller) -> InvokeForm:
    replica, now = browser.replica, browser.now()
    url = base_url(replica, browser.request)
    async with replica.db.read() as db:
        runtimes = await nodes.runtime_availability(db, now, replica.settings)
        found: dict[ArtifactKind, list[Artifact]] = {}
        for kind in (ArtifactKind.MODEL, ArtifactKind.CONFIG, ArtifactKind.INPUTS):
            found[kind], _ = await artifacts.list_for_tenant(
                db, tenant.tenant_id, now, url, kind=kind, limit=CHOICES
            )
    return InvokeForm(
        runtimes=[r.name.value for r in runtimes if r.nodes_online],
        models=found[ArtifactKind.MODEL] + found[ArtifactKind.CONFIG],
        inputs=found[ArtifactKind.INPUTS],
        max_timeout=replica.settings.max_timeout_sec,
    )


async def _invokes_page(
    browser: Browser,
    tenant: TenantCaller,
    *,
    status: str = "",
    cursor: str = "",
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    code: int = 200,
) -> Response:
    wanted = InvokeStatus(status) if status in STATUS_TABS[1:] else None
    async with browser.replica.db.read() as db:
        items, next_cursor = await invokes.list_for_tenant(
            db,
            tenant.tenant_id,
            status=wanted,
            limit=PAGE_SIZE,
            cursor=cursor if is_id("inv", cursor) else None,
        )
    form = await _invoke_form(browser, tenant)
    if values is None:
        values = {
            "runtime": next((r for r in ("onnx_cuda", "onnx_cpu") if r in form.runtimes), ""),
            "model": form.models[0].id if form.models else "",
            "inputs": "",
            "timeout_sec": "600",
        }
    return browser.render(
        "tenant/invokes.html",
        status=code,
        listed=items,
        next_cursor=next_cursor,
        paged=bool(cursor),
        filter=wanted.value if wanted else "",
        tabs=STATUS_TABS,
        form=form,
        values=values,
        errors=errors or {},
        idempotency=secrets.token_urlsafe(16),
        took=took,
    )


@router.get("")
async def invokes_page(signed: SignedTenant, status: str = "", cursor: str = "") -> Response:
    browser, tenant = signed
    return await _invokes_page(browser, tenant, status=status, cursor=cursor)


async def _chosen(
    browser: Browser, tenant: TenantCaller, artifact_id: str, kind: ArtifactKind, needs: str
) -> Artifact | str:
    """The tenant's live artifact of `kind`, or why it cannot be used."""
    if not is_id("art", artifact_id):
        return "Choose one of your artifacts."
    async with browser.replica.db.read() as db:
        try:
            artifact = await artifacts.get(
                db, tenant.tenant_id, artifact_id, base_url(browser.replica, browser.request)
            )
        except NotFound:
            return "That artifact is not yours or was deleted; choose another."
    if artifact.kind is not kind:
        found, wanted = artifact.kind.value, kind.value
        return f"That artifact is of kind {found}; {needs} needs one of kind {wanted}."
    if artifact.expires_at <= browser.now():
        return "That artifact has expired; upload it again."
    return artifact


@router.post("")
async def create_invoke(signed: SignedTenant) -> Response:
    browser, tenant = signed
    form = await form_of(browser)
    values = {n: text(form, n) for n in ("runtime", "model", "inputs", "timeout_sec")}
    errors: dict[str, str] = {}
    known = {r.value for r in RuntimeName}
    runtime = RuntimeName(values["runtime"]) if values["runtime"] in known else None
    if runtime is None:
        errors["runtime"] = "Choose a runtime."
    max_timeout = browser.replica.settings.max_timeout_sec
    timeout = int(values["timeout_sec"]) if values["timeout_sec"].isdigit() else 0
    if not 1 <= timeout <= max_timeout:
        errors["timeout_sec"] = f"A whole number of seconds from 1 to {max_timeout}."
    train = runtime is not None and runtime.kind == "train"
    wants = ArtifactKind.CONFIG if train else ArtifactKind.MODEL
    needs = runtime.value if runtime else "an ONNX runtime"
    model = await _chosen(browser, tenant, values["model"], wants, needs)
    if isinstance(model, str):
        errors["model"] = model
    inputs = (
        await _chosen(browser, tenant, values["inputs"], ArtifactKind.INPUTS, "this field")
        if values["inputs"]
        else None
    )
    if isinstance(inputs, str):
        errors["inputs"] = inputs
    if errors or runtime is None or isinstance(model, str) or isinstance(inputs, str):
        return await _invokes_page(browser, tenant, values=values, errors=errors, code=422)
    body = InvokeCreate(
        runtime=runtime,
        model_url=model.url,
        model_checksum_sha256=model.sha256,
        inputs_url=inputs.url if inputs else "",
        inputs_checksum_sha256=inputs.sha256 if inputs else None,
        timeout_sec=timeout,
    )
    replica = browser.replica
    key = text(form, "idempotency")[:255] or None
    try:
        invoke, created = await invokes.create(
            replica.db,
            replica.settings,
            tenant.tenant_id,
            body,
            idempotency_key=key,
            origins=origins(replica, browser.request),
            now=browser.now(),
        )
    except Conflict:  # this form was sent before, with other values: it is spent
        errors["form"] = "This form already started an invoke; check the values and send it again."
        return await _invokes_page(browser, tenant, values=values, errors=errors, code=409)
    except ApiError as exc:
        errors["form"] = exc.message
        return await _invokes_page(browser, tenant, values=values, errors=errors, code=exc.status)
    if created:  # other replicas heard it at the commit (`invokes.create`)
        replica.notifier.told_by_commit(Channel.WORK)
    return browser.redirect(f"/console/invokes/{invoke.id}", flash=f"Invoke {invoke.id} is queued.")


@dataclass(frozen=True)
class ArrayView:
    name: str
    dtype: str
    shape: str
    first: str


def _arrays_of(data: bytes) -> list[ArrayView] | None:
    """The NPZ's arrays, when numpy is here to read them (the server does not need it).

    A node wrote them, so they are read as any stranger's NPZ (`gpu_share.npz_reading`):
    judged by their headers before anything is inflated, and not shown at all when they
    would expand past `PREVIEW_MAX_BYTES` (a 1 MiB inline output can inflate to a GiB)."""
    try:
        import numpy as np

        from gpu_share.npz_reading import NpzError, load_npz_bytes
    except ImportError:
        return None
    try:
        arrays = load_npz_bytes(data, max_bytes=PREVIEW_MAX_BYTES)
    except NpzError:
        return None
    views = []
    for name, array in list(arrays.items())[:50]:
        flat = array.reshape(-1)[:PREVIEW_VALUES]
        first = np.array2string(flat, separator=", ", precision=4, threshold=PREVIEW_VALUES)
        more = " …" if array.size > PREVIEW_VALUES else ""
        shape = "×".join(str(n) for n in array.shape) or "scalar"
        views.append(ArrayView(name, str(array.dtype), shape, first + more))
    return views


def _metrics(invoke: Invoke) -> list[tuple[str, str]]:
    if invoke.result is None:
        return []
    m = invoke.result.metrics
    rows = [
        ("Device", m.device),
        ("Execution provider", m.execution_provider or "—"),
        ("GPU", m.gpu_model or "—"),
        ("Queued", _ms(m.queue_ms)),
        ("Download", _ms(m.download_ms)),
        ("Compute", _ms(m.compute_ms)),
        ("Total on the node", _ms(m.duration_ms)),
    ]
    if m.peak_rss_bytes is not None:
        rows.append(("Peak memory", f"{m.peak_rss_bytes / 2**20:.0f} MiB"))
    if m.peak_gpu_memory_bytes is not None:
        rows.append(("Peak GPU memory", f"{m.peak_gpu_memory_bytes / 2**20:.0f} MiB"))
    return rows


async def _owned_invoke(browser: Browser, tenant: TenantCaller, invoke_id: str) -> Invoke | None:
    if not is_id("inv", invoke_id):
        return None
    async with browser.replica.db.read() as db:
        try:
            return invokes.to_wire(await invokes.owned(db, tenant.tenant_id, invoke_id))
        except NotFound:
            return None


def _inline_outputs(invoke: Invoke) -> bytes | None:
    encoded = invoke.result.outputs_inline_base64 if invoke.result else None
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None


@router.get("/{invoke_id}")
async def invoke_page(invoke_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    invoke = await _owned_invoke(browser, tenant, invoke_id)
    if invoke is None:
        return not_found(browser, "invoke")
    log, cursor = "", 0
    async with browser.replica.db.read() as db:
        for _ in range(8):  # a finished job's whole log; a running one's follower reads on
            piece, cursor, _status = await invokes.read_logs(
                db, tenant.tenant_id, invoke.id, cursor
            )
            log += piece
            if not piece or not invoke.status.terminal:
                break
    inline = _inline_outputs(invoke)
    arrays = await asyncio.to_thread(_arrays_of, inline) if inline is not None else None
    outputs_url = invoke.result.outputs_url if invoke.result else None
    platform = bool(
        outputs_url
        and invokes.platform_artifact_id(outputs_url, origins(browser.replica, browser.request))
    )
    return browser.render(
        "tenant/invoke.html",
        invoke=invoke,
        log=log,
        cursor=cursor,
        metrics=_metrics(invoke),
        inline_size=len(inline) if inline is not None else None,
        arrays=arrays,
        platform_outputs=platform,
        external_outputs=outputs_url if outputs_url and not platform else None,
        took=took,
    )


@router.get("/{invoke_id}/log")
async def invoke_log(invoke_id: str, browser: BrowserDep, after: int = 0) -> Response:
    """What the page's log follower polls: text after `after`, as `GET …/logs` answers."""
    tenant = script_tenant(browser)
    if not is_id("inv", invoke_id):
        raise NotFound(f"invoke {invoke_id} does not exist")
    async with browser.replica.db.read() as db:
        piece, cursor, status = await invokes.read_logs(
            db, tenant.tenant_id, invoke_id, max(0, min(after, 2**53))
        )
    return PlainTextResponse(
        piece,
        headers={
            "X-Log-Cursor": str(cursor),
            "X-Invoke-Status": status.value,
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


@router.get("/{invoke_id}/outputs")
async def invoke_outputs(invoke_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    invoke = await _owned_invoke(browser, tenant, invoke_id)
    if invoke is None or invoke.result is None:
        return not_found(browser, "invoke with outputs")
    fmt = invoke.result.outputs_format or "npz"
    fmt = fmt if fmt.isascii() and fmt.isalnum() else "bin"  # the agent named it: not a header
    headers = {
        "Content-Disposition": f'attachment; filename="{invoke.id}-outputs.{fmt}"',
        "X-Content-Type-Options": "nosniff",
    }
    inline = _inline_outputs(invoke)
    if inline is not None:
        return Response(inline, media_type="application/octet-stream", headers=headers)
    url = invoke.result.outputs_url or ""
    artifact_id = invokes.platform_artifact_id(url, origins(browser.replica, browser.request))
    if artifact_id is None:
        return not_found(browser, "invoke with outputs stored here")
    try:
        async with browser.replica.db.read() as db:
            download = await artifacts.open_download(
                db, artifact_id, browser.now(), tenant_id=tenant.tenant_id
            )
    except (NotFound, Gone) as exc:
        return browser.render(
            "public/message.html", status=exc.status, title="Outputs gone", message=exc.message
        )
    response = await stream_download(browser.replica, download)
    response.headers.update(headers)
    return response


@router.post("/{invoke_id}/cancel")
async def cancel_invoke(invoke_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    if not is_id("inv", invoke_id):
        return not_found(browser, "invoke")
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            invoke = await invokes.cancel(
                db, tenant.tenant_id, invoke_id, browser.now(), replica.settings
            )
    except NotFound:
        return not_found(browser, "invoke")
    except Conflict as exc:
        return browser.redirect(f"/console/invokes/{invoke_id}", flash=exc.message)
    if invoke.status.terminal:
        await replica.notifier.publish(Channel.FINISHED, invoke_id)
        message = "The invoke is canceled."
    else:
        message = "Cancel requested: its node stops the job within a few seconds."
    return browser.redirect(f"/console/invokes/{invoke_id}", flash=message)
