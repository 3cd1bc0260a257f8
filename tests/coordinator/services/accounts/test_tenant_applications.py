"""Tenant applications: confirmed by the link mailed to their email, then approved into a
tenant with a working key or rejected with a reason; applying tells no one whether the
email applied before."""

import asyncio

import httpx
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import TenantApplicationRow
from gpu_share.coordinator.loops import housekeeping
from gpu_share.testing.applications import CONFIRM_LINK, apply_as_tenant, mailed_confirm_token
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, bearer

APPLICATION = {
    "name": "Ivan Petrov",
    "email": "ivan@example.com",
    "company": "Petrov ML",
    "intended_use": "Nightly CatBoost retraining and ONNX scoring",
}


async def confirm(client: httpx.AsyncClient, email: str = "ivan@example.com") -> httpx.Response:
    token = await mailed_confirm_token(client, email)
    return await client.post(f"/v1/tenant/applications/confirm/{token}")


async def test_application_confirmed_and_approved_creates_tenant_with_working_key(
    client: httpx.AsyncClient,
) -> None:
    submitted = await client.post("/v1/tenant/applications", json=APPLICATION)
    assert submitted.status_code == 201
    assert submitted.json()["email"] == "ivan@example.com" and "id" not in submitted.json()
    mails = (await client.get("/v1/admin/outbox", headers=ADMIN)).json()
    assert [m["subject"] for m in mails] == ["Confirm your email to apply for tenant access"]
    assert "/apply/tenant/confirm/gpu_cf_" in mails[0]["body"]
    listed = await client.get("/v1/admin/tenant-applications", headers=ADMIN)
    assert listed.json() == []  # not an application until its email is confirmed

    confirmed = await confirm(client)
    assert confirmed.status_code == 200, confirmed.text
    app_id = confirmed.json()["id"]
    assert confirmed.json()["status"] == "pending"
    assert (await confirm(client)).json() == confirmed.json()  # the link opened twice

    pending = await client.get(
        "/v1/admin/tenant-applications", params={"status": "pending"}, headers=ADMIN
    )
    assert [a["id"] for a in pending.json()] == [app_id]

    approved = await client.post(f"/v1/admin/tenant-applications/{app_id}/approve", headers=ADMIN)
    assert approved.status_code == 201
    key = approved.json()["api_key"]
    assert key.startswith("gpu_sk_")
    assert (await client.get("/v1/artifacts", headers=bearer(key))).status_code == 200

    again = await client.post(f"/v1/admin/tenant-applications/{app_id}/approve", headers=ADMIN)
    assert again.status_code == 409
    listed = await client.get("/v1/admin/tenant-applications", headers=ADMIN)
    assert listed.json()[0]["tenant_id"] == approved.json()["id"]


async def test_applying_answers_the_same_and_only_the_owner_hears_of_a_second(
    client: httpx.AsyncClient,
) -> None:
    first = await client.post("/v1/tenant/applications", json=APPLICATION)
    owner = await apply_as_tenant(client, {**APPLICATION, "name": "Ivan Himself"})
    again = await client.post(
        "/v1/tenant/applications", json={**APPLICATION, "email": "IVAN@example.com"}
    )
    assert (first.status_code, first.json()) == (again.status_code, again.json())

    second = await confirm(client)
    assert second.status_code == 409
    assert "already has an application under review" in second.json()["error"]["message"]
    assert owner["id"] not in second.text and "Himself" not in second.text
    listed = (await client.get("/v1/admin/tenant-applications", headers=ADMIN)).json()
    assert [a["id"] for a in listed] == [owner["id"]]  # the squatter's first blocks nothing


async def test_concurrent_confirmations_for_one_email_make_one(client: httpx.AsyncClient) -> None:
    for n in range(5):
        body = {**APPLICATION, "name": f"Ivan {n}"}
        assert (await client.post("/v1/tenant/applications", json=body)).status_code == 201
    mails = (await client.get("/v1/admin/outbox", headers=ADMIN)).json()
    tokens = [link.group(1) for m in mails if (link := CONFIRM_LINK.search(m["body"]))]
    answers = await asyncio.gather(
        *(client.post(f"/v1/tenant/applications/confirm/{token}") for token in tokens)
    )
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409, 409]


async def test_unconfirmed_applications_cannot_be_decided_and_are_deleted_after_a_week(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    await client.post("/v1/tenant/applications", json=APPLICATION)
    mails = (await client.get("/v1/admin/outbox", headers=ADMIN)).json()
    app_id = mails[0]["cause"].removesuffix(":confirm")
    refused = await client.post(f"/v1/admin/tenant-applications/{app_id}/approve", headers=ADMIN)
    assert refused.status_code == 404
    clock.advance(7 * 86_400)
    await housekeeping.run_once(app.state.replica)
    assert (await confirm(client)).status_code == 404
    async with app.state.replica.db.read() as session:
        assert (await session.scalars(select(TenantApplicationRow))).all() == []


async def test_rejection_records_reason_and_creates_no_tenant(client: httpx.AsyncClient) -> None:
    app_id = (await apply_as_tenant(client, APPLICATION))["id"]
    rejected = await client.post(
        f"/v1/admin/tenant-applications/{app_id}/reject",
        json={"reason": "Use case not supported yet"},
        headers=ADMIN,
    )
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "rejected"
    assert rejected.json()["reason"] == "Use case not supported yet"
    assert (await client.get("/v1/admin/tenants", headers=ADMIN)).json() == []


async def test_application_with_bad_email_names_the_field(client: httpx.AsyncClient) -> None:
    for email in ("nope", "ivan,eve@example.com", "Eve <eve@example.com>"):
        response = await client.post(
            "/v1/tenant/applications", json={**APPLICATION, "email": email}
        )
        assert response.status_code == 422
        body = response.json()["error"]
        assert body["code"] == "VALIDATION_ERROR"
        assert "email" in body["message"]
        assert body["details"][0]["loc"] == ["body", "email"]


async def test_rejecting_without_reason_is_422_and_unknown_application_404(
    client: httpx.AsyncClient,
) -> None:
    app_id = (await apply_as_tenant(client, APPLICATION))["id"]
    no_reason = await client.post(
        f"/v1/admin/tenant-applications/{app_id}/reject", json={}, headers=ADMIN
    )
    assert no_reason.status_code == 422
    missing = await client.post(
        f"/v1/admin/tenant-applications/{new_id('tapp')}/approve", headers=ADMIN
    )
    assert missing.status_code == 404
    forged = await client.post("/v1/tenant/applications/confirm/gpu_cf_" + "x" * 40)
    assert forged.status_code == 404
