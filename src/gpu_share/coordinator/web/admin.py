"""The admin's pages (SPEC §5, §3.1): an overview, provider applications and their review,
tenants and their applications, providers, nodes, keys, and the mail outbox.

Each page calls the same service as the admin API. An action that makes a secret (a
claim link, a tenant's first key, another key) answers with the page itself, the secret
shown this once: a secret never rides in a redirect or a cookie. Every other action
redirects with a flash, and a refused one shows the page again with the service's words
next to the field they are about.
"""

from enum import StrEnum
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from gpu_share.coordinator.api.deps import base_url
from gpu_share.coordinator.core.errors import ApiError, NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services import (
    accounts,
    benchmarks,
    nodes,
    outbox,
    overview,
    provider_applications,
    providers,
    tenant_billing,
)
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of, text
from gpu_share.protocol import accounts as accounts_wire
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.billing import TopUpCreate
from gpu_share.protocol.nodes import NodeStatus, Tier

router = APIRouter(prefix="/admin", include_in_schema=False)

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=StrEnum)

APPLICATION_TABS = [
    ("", "All"),
    *((s.value, s.value.replace("_", " ").capitalize()) for s in wire.ApplicationStatus),
]
KEY_TABS = [("", "All"), *((r.value, r.value.capitalize()) for r in accounts_wire.Role)]
NODE_ORDER = {NodeStatus.ONLINE: 0, NodeStatus.BUSY: 1, NodeStatus.OFFLINE: 2}
OUTBOX_LIMIT = 200


def _choice(kind: type[E], value: str) -> E | None:
    """The enum member a query or form value names; None for anything else."""
    try:
        return kind(value)
    except ValueError:
        return None


def _validated(
    model: type[M], values: dict[str, str], errors: dict[str, str], ids: dict[str, str]
) -> M | None:
    """The model, or each problem put next to its field (`ids` maps model fields to ids)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else ""
            errors.setdefault(ids.get(name, "form"), _message(problem))
        return None


def _message(problem: Any) -> str:
    if problem.get("type") == "string_too_short" and not problem.get("input"):
        return "Required"
    message = str(problem.get("msg", "invalid")).removeprefix("Value error, ")
    return message[:1].upper() + message[1:]


def _field_message(exc: ApiError, field: str) -> str | None:
    """The service's message about one field (a `field_error`), if it is about that field."""
    for detail in exc.details if isinstance(exc.details, list) else []:
        if isinstance(detail, dict) and list(detail.get("loc", []))[-1:] == [field]:
            return str(detail.get("msg", exc.message))
    return None


def _not_found(browser: Browser, message: str) -> Response:
    return browser.render("public/message.html", status=404, title="Not found", message=message)


# Overview


@router.get("")
async def overview_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    replica = browser.replica
    async with replica.db.read() as db:
        counts = await overview.counts(db, browser.now(), replica.settings)
        waiting = await provider_applications.list_applications(
            db, wire.ApplicationStatus.PENDING, limit=5
        )
    return browser.render("admin/overview.html", counts=counts, waiting=waiting)


# Provider applications


@router.get("/applications")
async def applications_page(signed: SignedAdmin, status: str = "") -> Response:
    browser, _ = signed
    chosen = _choice(wire.ApplicationStatus, status)
    async with browser.replica.db.read() as db:
        listed = await provider_applications.list_applications(db, chosen)
        by_status = await overview.applications_by_status(db)
    if chosen is None:  # the open ones first, newest first within each group
        listed.sort(key=lambda a: not a.status.open)
    return browser.render(
        "admin/applications.html",
        applications=listed,
        filters=APPLICATION_TABS,
        current=chosen.value if chosen else "",
        counts={"": sum(by_status.values()), **by_status},
    )


async def _application(browser: Browser, application_id: str) -> wire.ProviderApplication:
    if not is_id("papp", application_id):
        raise NotFound(f"provider application {application_id} does not exist")
    async with browser.replica.db.read() as db:
        return await provider_applications.get(db, application_id)


def _application_view(
    browser: Browser,
    application: wire.ProviderApplication,
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    approved: wire.Approved | None = None,
    status: int = 200,
) -> Response:
    return browser.render(
        "admin/application.html",
        status=status,
        application=application,
        # Without a UPS only Community is accepted; with one, the admin picks deliberately.
        values={"tier": "" if application.ups else Tier.COMMUNITY.value, **(values or {})},
        errors=errors or {},
        approved=approved,
        tiers=list(Tier),
    )


@router.get("/applications/{application_id}")
async def application_page(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return _not_found(browser, exc.message)
    return _application_view(browser, application)


@router.post("/applications/{application_id}/approve")
async def approve_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"tier": text(form, "tier")}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return _not_found(browser, exc.message)
    errors: dict[str, str] = {}
    tier = _choice(Tier, values["tier"])
    if tier is None:
        errors["tier"] = "Choose Enterprise or Community"
        return _application_view(browser, application, values=values, errors=errors, status=422)
    replica = browser.replica
    try:
        async with replica.db.write() as db:
            approved = await provider_applications.approve(
                db,
                application.id,
                tier,
                browser.now(),
                base_url(replica, browser.request),
            )
    except ApiError as exc:  # Enterprise without a UPS is about the tier; the rest is not
        about_tier = _field_message(exc, "tier")
        errors = {"tier": about_tier} if about_tier else {"form": exc.message}
        application = await _application(browser, application_id)
        return _application_view(
            browser, application, values=values, errors=errors, status=exc.status
        )
    return _application_view(browser, approved.application, approved=approved)


@router.post("/applications/{application_id}/reject")
async def reject_application(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"reason": text(form, "reason")}
    errors: dict[str, str] = {}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return _not_found(browser, exc.message)
    body = _validated(accounts_wire.Rejection, values, errors, {"reason": "reason"})
    if body is not None:
        try:
            async with browser.replica.db.write() as db:
                await provider_applications.reject(db, application.id, body.reason, browser.now())
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                f"/admin/applications/{application.id}",
                flash=f"Application rejected; {application.email} is mailed the reason.",
            )
    application = await _application(browser, application_id)
    return _application_view(browser, application, values=values, errors=errors, status=422)


@router.post("/applications/{application_id}/request-info")
async def request_information(application_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    form = await form_of(browser)
    values = {"message": text(form, "message")}
    errors: dict[str, str] = {}
    try:
        application = await _application(browser, application_id)
    except NotFound as exc:
        return _not_found(browser, exc.message)
    body = _validated(wire.InfoRequest, values, errors, {"message": "message"})
    if body is not None:
        replica = browser.replica
        try:
            async with replica.db.write() as db:
                await provider_applications.request_info(
                    db,
                    application.id,
                    body.message,
                    browser.now(),
                    base_url(replica, browser.request),
                    replica.signer,
                )
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                f"/admin/applications/{application.id}",
                flash=f"Information requested; {application.email} is mailed your message "
                "and a link to update the application.",
            )
    application = await _application(browser, application_id)
    return _application_view(browser, application, values=values, errors=errors, status=422)


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
        applications = await accounts.list_tenant_applications(db, None)
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
    body = _validated(
        accounts_wire.TenantCreate, values, errors, {"name": "name", "email": "email"}
    )
    if body is None:
        return await _tenants_view(browser, values=values, errors=errors, status=422)
    async with browser.replica.db.write() as db:
        created = await accounts.create_tenant(db, body, browser.now())
    return await _tenants_view(browser, created=created)


@router.post("/tenants/{tenant_id}/top-ups")
async def top_up_tenant(tenant_id: str, signed: SignedAdmin) -> Response:
    """Credit a payment received; the reference makes a resent form credit nothing."""
    browser, _ = signed
    form = await form_of(browser)
    values = {"amount": text(form, "amount"), "reference": text(form, "reference")}
    errors: dict[str, str] = {}
    body = _validated(TopUpCreate, values, errors, {"amount": "amount", "reference": "reference"})
    if body is None:
        problems = "; ".join(f"{name}: {message}" for name, message in errors.items())
        return await _tenants_view(browser, errors={"form": problems}, status=422)
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
            created = await accounts.approve_tenant_application(db, application_id, browser.now())
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
    body = _validated(accounts_wire.Rejection, {"reason": values[field]}, errors, {"reason": field})
    if body is not None:
        try:
            if not is_id("tapp", application_id):
                raise NotFound(f"tenant application {application_id} does not exist")
            async with browser.replica.db.write() as db:
                rejected = await accounts.reject_tenant_application(
                    db, application_id, body.reason, browser.now()
                )
        except ApiError as exc:
            errors["form"] = exc.message
        else:
            return browser.redirect(
                "/admin/tenants", flash=f"The application of {rejected.name} is rejected."
            )
    return await _tenants_view(browser, values=values, errors=errors, status=422)


# Providers and nodes


@router.get("/providers")
async def providers_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    replica = browser.replica
    async with replica.db.read() as db:
        listed = await overview.provider_summaries(db, browser.now(), replica.settings)
    return browser.render("admin/providers.html", providers=listed)


@router.get("/nodes")
async def nodes_page(signed: SignedAdmin, provider: str = "") -> Response:
    browser, _ = signed
    replica = browser.replica
    try:
        if provider and not is_id("prv", provider):
            raise NotFound(f"provider {provider} does not exist")
        async with replica.db.read() as db:
            listed = await nodes.list_nodes(db, browser.now(), replica.settings)
            owners = await overview.node_owners(db)
            of = await providers.get(db, provider) if provider else None
    except NotFound as exc:
        return _not_found(browser, exc.message)
    if of is not None:
        listed = [n for n in listed if owners[n.id].provider_id == of.id]
    listed.sort(key=lambda n: (NODE_ORDER.get(n.status, 3), owners[n.id].hostname, n.id))
    return browser.render("admin/nodes.html", nodes=listed, owners=owners, provider=of)


@router.post("/nodes/{node_id}/benchmark")
async def request_benchmark(node_id: str, signed: SignedAdmin) -> Response:
    """The node benchmarks itself when next idle; its heartbeat answers say so till then."""
    browser, _ = signed
    await form_of(browser)
    try:
        if not is_id("nod", node_id):
            raise NotFound(f"node {node_id} does not exist")
        async with browser.replica.db.write() as db:
            await benchmarks.request(db, node_id, browser.now())
    except NotFound as exc:
        return _not_found(browser, exc.message)
    return browser.redirect(
        f"/admin/nodes#{node_id}",
        flash=f"Benchmarks requested for node {node_id}: it runs them once it has no job "
        "and no session, and reports the scores.",
    )


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
    chosen = _choice(accounts_wire.Role, role)
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
    chosen = _choice(accounts_wire.Role, text(form, "role"))
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


# Outbox


@router.get("/outbox")
async def outbox_page(signed: SignedAdmin, waiting: bool = False) -> Response:
    browser, _ = signed
    async with browser.replica.db.read() as db:
        mails = await outbox.list_mails(db, unsent_only=waiting, limit=OUTBOX_LIMIT)
        unsent = await overview.mails_waiting(db)
    return browser.render(
        "admin/outbox.html",
        mails=mails,
        waiting=waiting,
        mails_waiting=unsent,
        limit=OUTBOX_LIMIT,
        smtp=bool(browser.replica.settings.smtp_host),
    )
