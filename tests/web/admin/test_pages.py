"""The admin's pages: reviewing applications in a real browser with what applicants typed
kept as text, and, over plain HTTP, who may open them and what each form refuses."""

import html
import re
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from playwright.async_api import Dialog

from gpu_share.testing.applications import apply_as_provider, apply_as_tenant
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY, TenantHandle, bearer
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in

HOSTILE_NAME = "<script>alert(1)</script> <b>Bold</b> Compute"
HOSTILE_COMPANY = "<img src=x onerror=alert(2)>"
ADMIN_PAGES = [
    "/admin",
    "/admin/applications",
    "/admin/tenants",
    "/admin/providers",
    "/admin/nodes",
    "/admin/incidents",
    "/admin/keys",
    "/admin/outbox",
]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF field"
    return found.group(1)


async def signed_in(client: httpx.AsyncClient, key: str) -> str:
    """Sign `client` in through the page, as a browser does; returns a page's CSRF token."""
    form = await client.get("/signin")
    done = await client.post("/signin", data={"csrf": csrf_of(form.text), "key": key})
    assert done.status_code == 303, done.text
    home = await client.get(done.headers["location"])
    assert home.status_code == 200
    return csrf_of(home.text)


async def submit(client: httpx.AsyncClient, **change: Any) -> dict[str, Any]:
    """An application whose applicant confirmed their email: one to review."""
    return await apply_as_provider(client, {**APPLICATION, **change})


async def test_an_admin_reviews_applications_in_a_browser_and_what_applicants_typed_stays_text(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    hostile = await submit(
        live.http,
        full_name=HOSTILE_NAME,
        company=HOSTILE_COMPANY,
        email="hostile@example.com",
        maintenance_notes="<i>Sundays</i>",
        ups=False,
    )
    other = await submit(live.http, email="second@example.com")
    agent = SimulatedAgent(live.base_url, node_inventory=inventory(hostname="rack-1-node-4"))
    await agent.register(live.enrollment_token)
    page = browsing.page
    dialogs: list[str] = []

    async def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    await sign_in(page, live.base_url, TEST_ADMIN_KEY)
    assert page.url.endswith("/admin")
    waiting = page.locator(".stat", has_text="Provider applications waiting")
    assert (await waiting.locator(".value").inner_text()).strip() == "2"
    await screenshot(page, tmp_path, "admin-overview")

    await (
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Applications").click()
    )
    await page.get_by_role("link", name=HOSTILE_NAME).wait_for()  # the name, as text
    assert await page.locator("main b, main img, main script, main i").count() == 0
    await screenshot(page, tmp_path, "admin-applications")

    await page.get_by_role("link", name=HOSTILE_NAME).click()
    assert page.url.endswith(f"/admin/applications/{hostile['id']}")
    main = page.locator("main")
    assert HOSTILE_COMPANY in await main.inner_text()
    assert "<i>Sundays</i>" in await main.inner_text()
    assert await page.locator("main b, main img, main script, main i").count() == 0
    await page.get_by_label("Enterprise").check()
    await page.get_by_role("button", name="Approve").click()
    refusal = page.locator("#tier-error")
    assert "Enterprise needs a UPS" in await refusal.inner_text()
    await screenshot(page, tmp_path, "admin-application-refused")

    await page.get_by_label("Community").check()
    await page.get_by_role("button", name="Approve").click()
    claim = await page.locator("#claim-link").inner_text()
    assert claim.startswith(f"{live.base_url}/provider/claim/gpu_ct_")
    assert "also mailed to the applicant" in await main.inner_text()
    assert (await page.locator("h1 .badge").inner_text()) == "approved"
    await screenshot(page, tmp_path, "admin-application-approved")

    await page.goto(f"{live.base_url}/admin/applications/{other['id']}")
    await page.get_by_label("Ask for more information").fill("Which data center are the H100s in?")
    await page.get_by_role("button", name="Request information").click()
    await page.get_by_role("status").filter(has_text="Information requested").wait_for()
    assert (await page.locator("h1 .badge").inner_text()) == "info requested"
    assert "Which data center are the H100s in?" in await main.inner_text()
    await screenshot(page, tmp_path, "admin-application-info-requested")

    await page.get_by_role("link", name="Outbox").click()
    approval = page.locator("details", has_text="approved")
    await approval.locator("summary").click()
    assert claim in await approval.locator("pre").inner_text()  # the same link, mailed
    await screenshot(page, tmp_path, "admin-outbox")

    for name in ("Wanted Ltd", "Unwanted Ltd"):
        email = f"{name.split()[0].lower()}@example.com"
        await apply_as_tenant(
            live.http, {"name": name, "email": email, "intended_use": "<i>Batch</i> scoring"}
        )
    await page.get_by_role("link", name="Tenants").click()
    assert "<i>Batch</i> scoring" in await main.inner_text()
    unwanted = page.get_by_role("region", name=re.compile("^Unwanted Ltd"))
    await unwanted.get_by_role("button", name="Reject").click()
    unwanted = page.get_by_role("region", name=re.compile("^Unwanted Ltd"))  # the page again
    assert "Required" in await unwanted.locator(".error").inner_text()
    await screenshot(page, tmp_path, "admin-tenant-applications")
    wanted = page.get_by_role("region", name=re.compile("^Wanted Ltd"))
    await wanted.get_by_role("button", name="Approve and create the tenant").click()
    assert "Tenant Wanted Ltd is created." in await main.inner_text()
    await page.get_by_label("Name").fill("<script>alert(3)</script> Labs")
    await page.get_by_label("Email").fill("labs@example.com")
    await page.get_by_role("button", name="Create tenant").click()
    key = await page.locator("#new-tenant-key").inner_text()
    assert key.startswith("gpu_sk_")
    await screenshot(page, tmp_path, "admin-tenants")

    await page.get_by_role("link", name="Providers").click()
    row = page.locator("tr", has_text=HOSTILE_COMPANY)  # named for the company
    assert "waiting" in await row.inner_text()  # approved, not claimed yet
    await screenshot(page, tmp_path, "admin-providers")
    await page.get_by_role("link", name="Nodes").click()
    assert "rack-1-node-4" in await main.inner_text()
    await screenshot(page, tmp_path, "admin-nodes")
    await page.get_by_role("link", name="Keys").click()
    assert await page.get_by_text("you are signed in with it").is_visible()
    await screenshot(page, tmp_path, "admin-keys")

    assert dialogs == []
    assert browsing.outside == []
    await agent.aclose()


async def test_a_tenant_signed_in_gets_403_on_every_admin_page(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await signed_in(client, tenant.key)
    for path in ADMIN_PAGES:
        response = await client.get(path)
        assert response.status_code == 403, path
        assert "This page is for admins" in response.text
    refused = await client.post(
        "/admin/tenants", data={"csrf": csrf_of((await client.get("/")).text), "name": "x"}
    )
    assert refused.status_code == 403


async def test_a_visitor_not_signed_in_is_sent_to_sign_in(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/keys")
    assert response.status_code == 303
    assert response.headers["location"] == "/signin?next=/admin/keys"


async def test_a_post_without_the_csrf_field_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await signed_in(client, TEST_ADMIN_KEY)
    created = await client.post("/admin/tenants", data={"name": "Sneaky", "email": "s@example.com"})
    revoked = await client.post(f"/admin/keys/{tenant.key_id}/revoke", data={})
    wrong = await client.post(f"/admin/keys/{tenant.key_id}/revoke", data={"csrf": "not-a-token"})
    assert (created.status_code, revoked.status_code, wrong.status_code) == (403, 403, 403)
    tenants = (await client.get("/v1/admin/tenants", headers=ADMIN)).json()
    assert [t["name"] for t in tenants] == ["Tenant One"]
    still = await client.get("/v1/gpu/runtimes", headers=tenant.headers)
    assert still.status_code == 200


async def test_enterprise_without_a_ups_is_refused_with_the_message_by_the_tier(
    client: httpx.AsyncClient,
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    application = await submit(client, ups=False)
    url = f"/admin/applications/{application['id']}"
    refused = await client.post(f"{url}/approve", data={"csrf": csrf, "tier": "enterprise"})
    assert refused.status_code == 422
    error = re.search(r'<p class="error" id="tier-error">([^<]*)</p>', refused.text)
    assert error and "Enterprise needs a UPS" in error.group(1)
    missing = await client.post(f"{url}/approve", data={"csrf": csrf})
    assert "Choose Enterprise or Community" in missing.text
    assert (
        await client.get(f"/v1/admin/provider-applications/{application['id']}", headers=ADMIN)
    ).json()["status"] == "pending"


async def test_reject_and_request_info_need_words_for_the_applicant(
    client: httpx.AsyncClient,
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    application = await submit(client)
    url = f"/admin/applications/{application['id']}"
    empty = await client.post(f"{url}/reject", data={"csrf": csrf, "reason": "  "})
    short = await client.post(f"{url}/request-info", data={"csrf": csrf, "message": "hm"})
    assert (empty.status_code, short.status_code) == (422, 422)
    assert 'id="reason-error">Required<' in empty.text
    assert 'id="message-error">String should have at least 3 characters<' in short.text

    rejected = await client.post(
        f"{url}/reject", data={"csrf": csrf, "reason": "We only take <b>data centers</b>."}
    )
    assert rejected.status_code == 303
    after = await client.get(rejected.headers["location"])
    assert "Application rejected" in after.text  # the flash
    assert html.escape("We only take <b>data centers</b>.", quote=False) in after.text
    again = await client.post(f"{url}/reject", data={"csrf": csrf, "reason": "twice"})
    assert again.status_code == 422
    assert "cannot be decided again" in again.text


async def test_an_admin_cannot_revoke_its_own_key_but_revokes_a_tenants(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    keys = (await client.get("/v1/admin/keys?role=admin", headers=ADMIN)).json()
    own = keys[0]["id"]
    refused = await client.post(f"/admin/keys/{own}/revoke", data={"csrf": csrf})
    assert refused.status_code == 409
    assert "a key cannot revoke itself" in refused.text

    revoked = await client.post(
        f"/admin/keys/{tenant.key_id}/revoke", data={"csrf": csrf, "role": "tenant"}
    )
    assert revoked.status_code == 303
    assert revoked.headers["location"] == "/admin/keys?role=tenant"
    assert "is revoked" in (await client.get(revoked.headers["location"])).text
    gone = await client.get("/v1/gpu/runtimes", headers=tenant.headers)
    assert gone.status_code == 401


async def test_a_created_tenant_and_an_issued_key_are_shown_once_and_work(
    client: httpx.AsyncClient,
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    bad = await client.post("/admin/tenants", data={"csrf": csrf, "name": "", "email": "nope"})
    assert bad.status_code == 422
    assert 'id="name-error">Required<' in bad.text
    assert 'id="email-error">Must be an email address' in bad.text

    made = await client.post(
        "/admin/tenants", data={"csrf": csrf, "name": "<b>Labs</b>", "email": "l@example.com"}
    )
    key = re.search(r'id="new-tenant-key">(gpu_sk_[\w-]+)<', made.text)
    assert key, made.text
    assert "&lt;b&gt;Labs&lt;/b&gt;" in made.text and "<b>Labs</b>" not in made.text
    assert (await client.get("/v1/gpu/runtimes", headers=bearer(key.group(1)))).status_code == 200
    assert key.group(1) not in (await client.get("/admin/tenants")).text  # once

    tenant_id = (await client.get("/v1/admin/tenants", headers=ADMIN)).json()[0]["id"]
    issued = await client.post("/admin/keys", data={"csrf": csrf, "tenant_id": tenant_id})
    second = re.search(r'id="new-key">(gpu_sk_[\w-]+)<', issued.text)
    assert second and second.group(1) != key.group(1), issued.text
    unnamed = await client.post("/admin/keys", data={"csrf": csrf, "tenant_id": ""})
    assert 'id="tenant_id-error">Choose the tenant' in unnamed.text


async def test_tenant_applications_are_approved_with_a_key_or_rejected_with_a_reason(
    client: httpx.AsyncClient,
) -> None:
    wanted, unwanted = [
        (
            await apply_as_tenant(
                client, {"name": name, "email": f"{n}@example.com", "intended_use": "<i>Batch</i>"}
            )
        )["id"]
        for n, name in enumerate(("Wanted Ltd", "Unwanted Ltd"))
    ]
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    page = await client.get("/admin/tenants")
    assert "&lt;i&gt;Batch&lt;/i&gt;" in page.text

    approved = await client.post(
        f"/admin/tenant-applications/{wanted}/approve", data={"csrf": csrf}
    )
    key = re.search(r'id="new-tenant-key">(gpu_sk_[\w-]+)<', approved.text)
    assert key and "Tenant Wanted Ltd is created." in approved.text
    empty = await client.post(
        f"/admin/tenant-applications/{unwanted}/reject", data={"csrf": csrf, "reason": ""}
    )
    assert f'id="reason-{unwanted}-error">Required<' in empty.text
    rejected = await client.post(
        f"/admin/tenant-applications/{unwanted}/reject",
        data={"csrf": csrf, "reason": "Not a fit"},
    )
    assert rejected.status_code == 303
    listed = (await client.get("/v1/admin/tenant-applications", headers=ADMIN)).json()
    assert {a["name"]: a["status"] for a in listed} == {
        "Wanted Ltd": "approved",
        "Unwanted Ltd": "rejected",
    }


async def test_pages_show_empty_states_and_unknown_ids_answer_404(
    client: httpx.AsyncClient,
) -> None:
    await signed_in(client, TEST_ADMIN_KEY)
    expected = {
        "/admin": "No applications waiting",
        "/admin/applications": "No applications waiting",
        "/admin/providers": "No providers yet",
        "/admin/nodes": "No nodes yet",
        "/admin/outbox": "No mail yet",
        "/admin/outbox?waiting=true": "No mails waiting",
        "/admin/tenants": "No tenant applications waiting",
    }
    for path, words in expected.items():
        response = await client.get(path)
        assert response.status_code == 200, path
        assert words in response.text, path
    for path in ("/admin/applications/papp_nope", "/admin/nodes?provider=prv_nope"):
        assert (await client.get(path)).status_code == 404, path


async def test_the_outbox_and_nodes_pages_show_mail_bodies_and_machines(
    client: httpx.AsyncClient, app: FastAPI, provider: Any
) -> None:
    await signed_in(client, TEST_ADMIN_KEY)
    application = await submit(client, full_name="Mail Reader")
    mails = await client.get("/admin/outbox?waiting=true")
    assert "Mail Reader" in mails.text
    assert f"{application['id']}:received" in mails.text
    assert "No SMTP server is configured" in mails.text

    agent = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),
        node_inventory=inventory(hostname="gpu-box-9", region="eu-central"),
    )
    await agent.register(provider.enrollment_token)
    page = await client.get("/admin/nodes")
    assert "gpu-box-9" in page.text and "eu-central" in page.text
    assert '<span class="badge s-online">online</span>' in page.text
    assert "not isolated" in page.text  # the simulated agent runs jobs as plain processes
    of_provider = await client.get(f"/admin/nodes?provider={provider.id}")
    assert "gpu-box-9" in of_provider.text
    providers = await client.get("/admin/providers")
    assert "issued directly" in providers.text and "1 / 1" in providers.text
    await agent.aclose()
