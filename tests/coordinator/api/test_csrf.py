"""Every form the pages post (every POST route hidden from the OpenAPI document, found by
walking the app: `operations.py`) refuses a missing or a wrong CSRF token with 403 and
changes nothing, for a browser signed in through the real sign-in with the form's role.

The forms are aimed at real objects (the caller's own key, invoke, artifact, session,
reservation, enrollment token, node; a tenant's account; applications in review) with
the fields a real submission carries, so a form that skipped its check would change the
database; that it would is shown by submitting a few of them with the right token.
"""

from collections.abc import Mapping
from contextlib import AsyncExitStack

import httpx
from fastapi import FastAPI

from gpu_share.protocol.accounts import Role
from gpu_share.testing.applications import apply_as_provider, apply_as_tenant
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY
from gpu_share.testing.simulated_agent import H100
from tests.coordinator.api.keyholders import SignedBrowser, browser
from tests.coordinator.api.operations import (
    SCRIPT_ROUTES,
    Operation,
    Tally,
    api_operations,
    error_shaped,
    page_operations,
    roles_of,
)
from tests.coordinator.api.rivals import Side, side
from tests.coordinator.api.test_cross_tenant import digest
from tests.coordinator.services.providers.test_provider_applications import APPLICATION

# What a real submission of some forms carries: a forged one must not get it through.
FORGED_FIELDS: dict[str, dict[str, str]] = {
    "POST /signin": {"key": TEST_ADMIN_KEY},
    "POST /admin/tenants": {"name": "Forged Tenant", "email": "forged@example.com"},
    "POST /admin/tenants/{tenant_id}/top-ups": {"amount": "5", "reference": "forged-top-up"},
    "POST /admin/keys": {"tenant_id": "{tenant_id}"},
    "POST /admin/applications/{application_id}/reject": {"reason": "forged"},
    "POST /admin/tenant-applications/{application_id}/reject": {"reason": "forged"},
    "POST /provider/pricing": {"gpu_model": H100.model, "price": "9", "discount": "40"},
    "POST /provider/pricing/remove": {"gpu_model": H100.model},
    "POST /console/invokes": {"runtime": "onnx_cpu", "model": "{artifact_id}", "timeout_sec": "60"},
    "POST /provider/payouts/settings": {"method": "solana_usdc", "address": "Forged1111111111"},
}
TENANT_APPLICATION = {"name": "Csrf Check", "email": "csrf.tenant@example.com", "intended_use": "x"}


def forms_of(app: FastAPI, document: Mapping[str, object]) -> list[Operation]:
    return [
        operation
        for operation in api_operations(app, document) + page_operations(app)
        if operation.hidden and operation.method == "POST"
    ]


async def real_ids(client: httpx.AsyncClient, a: Side) -> dict[str, str]:
    """An object of A's (or in review) for each path parameter a form names."""
    provider_application = await apply_as_provider(
        client, {**APPLICATION, "email": "csrf.provider@example.com"}
    )
    tenant_application = await apply_as_tenant(client, TENANT_APPLICATION)
    ids = {param: owned[-1] for param, owned in a.owned.items()}
    ids["invoke_id"] = a.owned["invoke_id"][-1]  # the running one, which a cancel would end
    return {
        **ids,
        "tenant_id": a.tenant.id,
        "provider_id": a.provider.id,
        "token": provider_application["status_token"],
        "papp": provider_application["id"],
        "tapp": tenant_application["id"],
    }


def aimed(operation: Operation, ids: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The form's URL at real objects, and the fields a real submission carries."""
    values = {p: ids[p] for p in operation.params if p in ids}
    if "application_id" in operation.params:
        kind = "tapp" if "tenant-applications" in operation.path else "papp"
        values["application_id"] = ids[kind]
    fields = {k: v.format_map(ids) for k, v in FORGED_FIELDS.get(operation.name, {}).items()}
    return operation.url(**values), fields


async def test_every_form_refuses_a_missing_or_wrong_csrf_token_and_changes_nothing(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    a = await side(app, client, "A", rich=True)
    ids = await real_ids(client, a)
    forms = forms_of(app, (await client.get("/openapi.json")).json())
    tally = Tally("CSRF")
    async with AsyncExitStack() as stack:
        signed = {
            role: await stack.enter_async_context(browser(app, key))
            for role, key in (
                (Role.TENANT, a.tenant.key),
                (Role.PROVIDER, a.provider.key),
                (Role.ADMIN, TEST_ADMIN_KEY),
            )
        }
        stranger = await stack.enter_async_context(browser(app))
        before = await digest(app.state.replica)
        for form in forms:
            roles = roles_of(form)
            # A public form is posted from a signed-in browser: a forged sign-in or
            # sign-out would then replace or end its session.
            own = signed[Role.TENANT] if roles is None else signed[next(iter(roles))]
            await _forged(own, stranger, form, ids, tally)
        after = await digest(app.state.replica)
        changed = sorted(t for t in before if before[t] != after[t])
        tally.check(not changed, f"refused forms changed the tables {changed}")
        await _side_effects_absent(client, a, tally)
        await _the_right_token_gets_through(signed[Role.ADMIN], a, app, tally)
    tally.verdict(at_least=4 * len(forms))
    assert len(forms) >= 30, f"only {len(forms)} forms found: is the walk of the app broken?"


async def _forged(
    own: SignedBrowser,
    stranger: SignedBrowser,
    form: Operation,
    ids: Mapping[str, str],
    tally: Tally,
) -> None:
    url, fields = aimed(form, ids)
    wrong = {
        "no token": None,
        "an empty token": "",
        "a made-up token": "x" * 40,
        "another browser's token": stranger.csrf,
    }
    for label, token in wrong.items():
        if form.name in SCRIPT_ROUTES:  # the upload carries its token in a header
            headers = {} if token is None else {"X-CSRF-Token": token}
            answer = await own.http.post(url, content=b"forged bytes", headers=headers)
            refused = error_shaped(answer, 403)
        else:
            data = fields if token is None else {**fields, "csrf": token}
            answer = await own.http.post(url, data=data)
            refused = answer.status_code == 403 and "not sent from this site" in answer.text
        tally.check(refused, f"{form.name} with {label} → 403", answer)


async def _side_effects_absent(client: httpx.AsyncClient, a: Side, tally: Tally) -> None:
    """What the most tempting forgeries would have done, looked for one by one."""
    tenants = (await client.get("/v1/admin/tenants", headers=ADMIN)).json()
    tally.check(all(t["name"] != "Forged Tenant" for t in tenants), "no forged tenant")
    mine = await client.get("/v1/artifacts", headers=a.tenant.headers)
    tally.check(mine.status_code == 200, "the tenant's key was not revoked", mine)
    tally.check(a.owned["artifact_id"][0] in mine.text, "the artifact was not deleted", mine)
    running = await client.get(
        f"/v1/gpu/invokes/{a.owned['invoke_id'][-1]}", headers=a.tenant.headers
    )
    still = running.status_code == 200 and running.json()["status"] == "running"
    tally.check(still, "the invoke was not canceled", running)
    balance = await client.get("/v1/billing/balance", headers=a.tenant.headers)
    tally.check("forged" not in balance.text, "no forged top-up", balance)


async def _the_right_token_gets_through(
    admin: SignedBrowser, a: Side, app: FastAPI, tally: Tally
) -> None:
    """The control: the same forged fields with the page's own token do change things."""
    before = await digest(app.state.replica)
    made = await admin.http.post(
        "/admin/tenants", data={**FORGED_FIELDS["POST /admin/tenants"], "csrf": admin.csrf}
    )
    tally.check(made.status_code in (200, 303), "POST /admin/tenants with its token", made)
    after = await digest(app.state.replica)
    tally.check(before["tenants"] != after["tenants"], "the control changed the tenants table")
