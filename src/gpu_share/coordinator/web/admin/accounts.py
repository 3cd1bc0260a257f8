"""Tenants and their keys: the tenants with their balances, creating one (its first key
shown this once), crediting a top-up, approving or rejecting a tenant's application, and
every key by role, issued for a tenant or revoked."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ApiError, NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.accounts import accounts, tenant_applications
from gpu_share.coordinator.services.money import tenant_billing
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.web.admin.forms import choice, validated
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of, text, typed
from gpu_share.protocol import accounts as accounts_wire
from gpu_share.protocol.billing import TopUpCreate

router = APIRouter(prefix="/admin", include_in_schema=False)

KEY_TABS = [("", "All"), *((r.value, r.value.capitalize()) for r in accounts_wire.Role)]


# Tenants and tenant applications


async def _tenants_view(
    browser: Browser,
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    created: accounts_wire.TenantWithKey | None = None,
    status: int = 200,
) -> Response:
    async with browser.replica.db.read() as db:
        tenants = await accounts.list_tenants(db)
        applications = await tenant_applications.list_applications(db, None)
        balances = await tenant_billing.available_by_tenant(db)
    tenants.sort(key=lambda t: t.created_at, reverse=True)
    applications.sort(key=lambda a: (a.status is not a.status.PENDING, -a.created_at.timestamp()))
    return browser.render(
        "admin/tenants.html",
        status=status,
        tenants=tenants,
        balances=balances,
        billing=browser.replica.settings.billing.value,
        applications=applications,
        values=values or {},
        errors=errors or {},
        created=created,
    )


@router.get("/tenants")
async def tenants_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    return await _tenants_view(browser)


@router.post("/tenants")
async def create_tenant(signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"name": text(form, "name"), "email": text(form, "email")}
    errors: dict[str, str] = {}
    body = validated(accounts_wire.TenantCreate, values, errors, {"name": "name", "email": "email"})
    if body is None:
        return await _tenants_view(browser, values=values, errors=errors, status=422)
    async with browser.replica.db.write() as db:
        created = await accounts.create_tenant(db, body, browser.now())
    return await _tenants_view(browser, created=created)


@router.post("/tenants/{tenant_id}/top-ups")
async def top_up_tenant(tenant_id: str, signed: SignedAdmin) -> Response:
    """Credit a payment received; the reference makes a resent form credit nothing.
    A problem is shown beside the field of this tenant's row (its ids carry the tenant's)."""
    browser, _ = signed
    form = await form_of(browser)
    ids = {name: f"{name}-{tenant_id}" for name in ("amount", "reference")}
    given = {"amount": typed(form, "amount"), "reference": text(form, "reference")}
    errors: dict[str, str] = {}
    body = validated(TopUpCreate, given, errors, ids)
    if body is None:
        values = {ids[name]: value for name, value in given.items()}
        return await _tenants_view(browser, values=values, errors=errors, status=422)
    try:
        if not is_id("ten", tenant_id):
            raise NotFound(f"tenant {tenant_id} does not exist")
        async with browser.replica.db.write() as db:
            made = await tenant_billing.top_up(
                db, tenant_id, body, idempotency_key=None, admin="admin", now=browser.now()
            )
    except ApiError as exc:
        return await _tenants_view(browser, errors={"form": exc.message}, status=exc.status)
    said = (
        f"Reference {made.reference} was credited before; nothing added."
        if made.replayed
        else f"Credited {made.amount} USDC (reference {made.reference})."
    )
    return browser.redirect(
        f"/admin/tenants#{tenant_id}", flash=f"{said} Balance: {made.available} USDC."
    )


@router.post("/tenant-applications/{application_id}/approve")
async def approve_tenant_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    await form_of(browser)
    try:
        if not is_id("tapp", application_id):
            raise NotFound(f"tenant application {application_id} does not exist")
        async with browser.replica.db.write() as db:
            created = await tenant_applications.approve(db, application_id, browser.now())
    except ApiError as exc:
        return await _tenants_view(browser, errors={"form": exc.message}, status=exc.status)
    return await _tenants_view(browser, created=created)


@router.post("/tenant-applications/{application_id}/reject")
async def reject_tenant_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    field = f"reason-{application_id}"
    values = {field: text(form, "reason")}
    errors: dict[str, str] = {}
    body = validated(accounts_wire.Rejection, {"reason": values[field]}, errors, {"reason": field})
    if body is not None:
        try:
            if not is_id("tapp", application_id):
                raise NotFound(f"tenant application {application_id} does not exist")
            async with browser.replica.db.write() as db:
                rejected = await tenant_applications.reject(
                    db, application_id, body.reason, browser.now()
                )
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                "/admin/tenants", flash=f"The application of {rejected.name} is rejected."
            )
    return await _tenants_view(browser, values=values, errors=errors, status=422)


# Keys


async def _keys_view(
    browser: Browser,
    caller_key_id: str,
    role: str = "",
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    issued: accounts_wire.IssuedKey | None = None,
    status: int = 200,
) -> Response:
    chosen = choice(accounts_wire.Role, role)
    async with browser.replica.db.read() as db:
        listed = await accounts.list_keys(db, chosen)
        owners = await overview.key_owners(db)
        tenants = await overview.tenant_names(db)
    listed.sort(key=lambda k: (k.revoked_at is not None, -k.created_at.timestamp()))
    return browser.render(
        "admin/keys.html",
        status=status,
        keys=listed,
        owners=owners,
        tenants=tenants,
        filters=KEY_TABS,
        current=chosen.value if chosen else "",
        caller_key_id=caller_key_id,
        values=values or {},
        errors=errors or {},
        issued=issued,
    )


@router.get("/keys")
async def keys_page(signed: SignedAdmin, role: str = "") -> Response:
    browser, admin = signed
    return await _keys_view(browser, admin.key_id, role)


@router.post("/keys")
async def issue_tenant_key(signed: SignedAdmin) -> Response:
    browser, admin = signed
    form = await form_of(browser)
    values = {"tenant_id": text(form, "tenant_id")}
    try:
        if not is_id("ten", values["tenant_id"]):
            raise NotFound("Choose the tenant the key is for")
        async with browser.replica.db.write() as db:
            issued = await accounts.issue_tenant_key(db, values["tenant_id"], browser.now())
    except ApiError as exc:
        return await _keys_view(
            browser, admin.key_id, values=values, errors={"tenant_id": exc.message}, status=422
        )
    return await _keys_view(browser, admin.key_id, issued=issued)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: str, signed: SignedAdmin) -> Response:
    browser, admin = signed
    form = await form_of(browser)
    chosen = choice(accounts_wire.Role, text(form, "role"))
    role = chosen.value if chosen else ""
    replica = browser.replica
    try:
        if not is_id("key", key_id):
            raise NotFound(f"key {key_id} does not exist")
        async with replica.db.write() as db:
            revoked = await accounts.revoke_key(
                db, key_id, browser.now(), caller_key_id=admin.key_id
            )
    except ApiError as exc:
        return await _keys_view(
            browser, admin.key_id, role, errors={"form": exc.message}, status=exc.status
        )
    replica.key_cache.clear()  # its sessions end with the next request, as its API calls do
    return browser.redirect(
        f"/admin/keys?role={role}" if role else "/admin/keys",
        flash=f"Key {revoked.prefix}… is revoked; it no longer signs anything in.",
    )
