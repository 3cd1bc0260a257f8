"""The tenant's console (SPEC §5): its overview, artifacts, sessions, nodes and keys; the
API's services behind the session cookie.

Every read passes the signed-in tenant's id to the service, so another tenant's
invoke, artifact or session is a 404 here exactly as in the API. Pages answer a
person (a page, a redirect with a flash); the routes that scripts call (the upload,
the log follower) answer in the API's JSON error shape instead, since a redirect to
/signin would only confuse the script.
"""

import json
import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from gpu_share.coordinator.core.errors import Conflict, Forbidden, NotFound, field_error
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.core.principals import TenantCaller
from gpu_share.coordinator.http.artifacts import UploadKind, declared_length
from gpu_share.coordinator.http.replica import base_url
from gpu_share.coordinator.services.accounts import accounts
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.coordinator.services.work import invokes
from gpu_share.coordinator.web import session
from gpu_share.coordinator.web.pages import (
    FLASH_COOKIE,
    Browser,
    BrowserDep,
    SignedTenant,
    form_of,
)
from gpu_share.coordinator.web.tenant.invokes import not_found, script_tenant, took
from gpu_share.protocol.accounts import IssuedKey, Role
from gpu_share.protocol.artifacts import ArtifactKind
from gpu_share.protocol.invokes import HELLO_WORLD

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 25
RECENT = 5
SHA256 = re.compile(r"[0-9a-f]{64}")


def _until(moment: datetime, now: datetime) -> str:
    seconds = int((moment - now).total_seconds())
    if seconds <= 0:
        return "expired"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"in {seconds // size} {unit}"
    return f"in {seconds} s"


def _sessions(browser: Browser) -> Sessions:
    replica = browser.replica
    return Sessions.of(replica)


# Overview


def _curl_example(url: str, runtime: str, model_url: str) -> str:
    body = {"runtime": runtime, "model_url": model_url, "inputs_url": "", "timeout_sec": 60}
    lines = json.dumps(body, indent=2).replace("\n", "\n  ")
    return (
        "export GPU_SHARE_API_KEY=gpu_sk_…   # your key\n"
        f"curl -s -X POST {url}/v1/gpu/invoke \\\n"
        '  -H "Authorization: Bearer $GPU_SHARE_API_KEY" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f"  -d '{lines}'"
    )


@router.get("/console")
async def overview(signed: SignedTenant) -> Response:
    browser, tenant = signed
    replica, now = browser.replica, browser.now()
    url = base_url(replica, browser.request)
    async with replica.db.read() as db:
        recent, _ = await invokes.list_for_tenant(
            db, tenant.tenant_id, status=None, limit=RECENT, cursor=None
        )
        used = await artifacts.tenant_usage(db, tenant.tenant_id, now)
        models, _ = await artifacts.list_for_tenant(
            db, tenant.tenant_id, now, url, kind=ArtifactKind.MODEL, limit=1
        )
        runtimes = await nodes.runtime_availability(db, now, replica.settings)
        online = await nodes.count_online(db, now, replica.settings)
    open_sessions = await _sessions(browser).list_for_tenant(
        tenant.tenant_id, include_closed=False, limit=RECENT
    )
    served = [r.name.value for r in runtimes if r.nodes_online]
    runtime = next((r for r in ("onnx_cuda", "onnx_cpu") if r in served), "onnx_cuda")
    model_url = models[0].url if models else str(HELLO_WORLD["model_url"])
    quota = replica.settings.tenant_quota_bytes
    return browser.render(
        "tenant/overview.html",
        recent=recent,
        open_sessions=open_sessions,
        used=used,
        quota=quota,
        used_pct=min(100.0, 100.0 * used / quota),
        online=online,
        served=served,
        api_url=url,
        curl=_curl_example(url, runtime, model_url),
        took=took,
    )


# Artifacts


@router.get("/console/artifacts")
async def artifacts_page(signed: SignedTenant, cursor: str = "") -> Response:
    browser, tenant = signed
    replica, now = browser.replica, browser.now()
    async with replica.db.read() as db:
        items, next_cursor = await artifacts.list_for_tenant(
            db,
            tenant.tenant_id,
            now,
            base_url(replica, browser.request),
            limit=PAGE_SIZE,
            cursor=cursor if is_id("art", cursor) else None,
        )
        used = await artifacts.tenant_usage(db, tenant.tenant_id, now)
    settings = replica.settings
    return browser.render(
        "tenant/artifacts.html",
        listed=items,
        next_cursor=next_cursor,
        paged=bool(cursor),
        used=used,
        quota=settings.tenant_quota_bytes,
        used_pct=min(100.0, 100.0 * used / settings.tenant_quota_bytes),
        limits={
            k.value: artifacts.upload_limit(settings, ArtifactKind(k.value)) for k in UploadKind
        },
        until=_until,
        api_url=base_url(replica, browser.request),
    )


@router.post("/console/artifacts/upload")
async def upload_artifact(
    browser: BrowserDep, kind: str = "", name: str = "", content_sha256: str = ""
) -> Response:
    """The browser's upload: the raw file streams in, as with `POST /v1/artifacts`.

    The session cookie says who; the `X-CSRF-Token` header proves the page sent it.
    The page sends no checksum (hashing first would read the file twice), so under
    CHECKSUM_MODE=enforce only a page that adds `content_sha256` can upload.
    """
    tenant = script_tenant(browser)
    replica = browser.replica
    token = browser.request.headers.get("x-csrf-token")
    if not session.csrf_ok(replica.signer, browser.identity, token):
        raise Forbidden("this upload was not sent from this site's page; reload it and try again")
    if kind not in {k.value for k in UploadKind}:
        raise field_error("kind", "must be model, inputs or config")
    if content_sha256 and not SHA256.fullmatch(content_sha256):
        raise field_error("content_sha256", "must be 64 lowercase hex digits")
    stored = await artifacts.upload(
        replica.db,
        replica.store,
        replica.settings,
        artifacts.UploadRequest(
            tenant_id=tenant.tenant_id,
            kind=ArtifactKind(kind),
            content_sha256=content_sha256 or None,
            declared_length=declared_length(browser.request),
            name=name or None,
        ),
        browser.request.stream(),
        browser.now(),
        base_url(replica, browser.request),
    )
    label = stored.name or "The file"
    response = JSONResponse({"next": "/console/artifacts", "id": stored.id}, status_code=201)
    response.set_cookie(
        FLASH_COOKIE,
        quote(f"{label} is uploaded as {stored.id} ({stored.kind.value})."),
        max_age=60,
        httponly=True,
        path="/",
    )
    return browser.finish(response)


@router.post("/console/artifacts/{artifact_id}/delete")
async def delete_artifact(artifact_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    if not is_id("art", artifact_id):
        return not_found(browser, "artifact")
    try:
        await artifacts.delete_artifact(
            browser.replica.db, browser.replica.store, tenant.tenant_id, artifact_id
        )
    except NotFound:
        return not_found(browser, "artifact")
    return browser.redirect("/console/artifacts", flash=f"Artifact {artifact_id} is deleted.")


# Sessions, nodes, keys


@router.get("/console/sessions")
async def sessions_page(signed: SignedTenant) -> Response:
    browser, tenant = signed
    found = await _sessions(browser).list_for_tenant(
        tenant.tenant_id, include_closed=True, limit=50
    )
    return browser.render(
        "tenant/sessions.html",
        open_sessions=[s for s in found if s.status.open],
        closed=[s for s in found if not s.status.open],
        api_url=base_url(browser.replica, browser.request),
    )


@router.post("/console/sessions/{session_id}/close")
async def close_session(session_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    if not is_id("ses", session_id):
        return not_found(browser, "session")
    try:
        await _sessions(browser).delete(tenant.tenant_id, session_id)
    except NotFound:
        return not_found(browser, "session")
    return browser.redirect("/console/sessions", flash=f"Session {session_id} is closed.")


@router.get("/console/nodes")
async def nodes_page(signed: SignedTenant) -> Response:
    browser, _tenant = signed
    replica, now = browser.replica, browser.now()
    async with replica.db.read() as db:
        found = await nodes.list_nodes(db, now, replica.settings)
        runtimes = await nodes.runtime_availability(db, now, replica.settings)
    return browser.render("tenant/nodes.html", nodes=found, runtimes=runtimes)


async def _keys_page(
    browser: Browser,
    tenant: TenantCaller,
    *,
    issued: IssuedKey | None = None,
    error: str | None = None,
    code: int = 200,
) -> Response:
    async with browser.replica.db.read() as db:
        keys = await accounts.list_keys(db, Role.TENANT, tenant_id=tenant.tenant_id)
    context: dict[str, Any] = {"keys": keys[::-1], "issued": issued, "error": error}
    return browser.render("tenant/keys.html", status=code, current=tenant.key_id, **context)


@router.get("/console/keys")
async def keys_page(signed: SignedTenant) -> Response:
    browser, tenant = signed
    return await _keys_page(browser, tenant)


@router.post("/console/keys")
async def issue_key(signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    async with browser.replica.db.write() as db:
        issued = await accounts.issue_tenant_key(db, tenant.tenant_id, browser.now())
    # Shown once, so rendered rather than redirected: a flash cookie must not carry it.
    return await _keys_page(browser, tenant, issued=issued)


@router.post("/console/keys/{key_id}/revoke")
async def revoke_key(key_id: str, signed: SignedTenant) -> Response:
    browser, tenant = signed
    await form_of(browser)
    if not is_id("key", key_id):
        return not_found(browser, "key")
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            revoked = await accounts.revoke_key(
                db,
                key_id,
                browser.now(),
                caller_key_id=tenant.key_id,
                tenant_id=tenant.tenant_id,
            )
    except NotFound:
        return not_found(browser, "key")
    except Conflict as exc:
        return await _keys_page(browser, tenant, error=exc.message, code=409)
    replica.key_cache.clear()  # its browser sessions and API calls end now, not in 5 s
    return browser.redirect(
        "/console/keys",
        flash=f"Key {revoked.prefix}… is revoked: programs using it now get 401.",
    )
