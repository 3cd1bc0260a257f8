import httpx

from gpu_share.coordinator.core.ids import new_id
from gpu_share.testing.factories import ADMIN, bearer

APPLICATION = {
    "name": "Ivan Petrov",
    "email": "ivan@example.com",
    "company": "Petrov ML",
    "intended_use": "Nightly CatBoost retraining and ONNX scoring",
}


async def test_application_approved_creates_tenant_with_working_key(
    client: httpx.AsyncClient,
) -> None:
    submitted = await client.post("/v1/tenant/applications", json=APPLICATION)
    assert submitted.status_code == 201
    app_id = submitted.json()["id"]
    assert submitted.json()["status"] == "pending"

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


async def test_rejection_records_reason_and_creates_no_tenant(client: httpx.AsyncClient) -> None:
    app_id = (await client.post("/v1/tenant/applications", json=APPLICATION)).json()["id"]
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
    response = await client.post("/v1/tenant/applications", json={**APPLICATION, "email": "nope"})
    assert response.status_code == 422
    body = response.json()["error"]
    assert body["code"] == "VALIDATION_ERROR"
    assert "email" in body["message"]
    assert body["details"][0]["loc"] == ["body", "email"]


async def test_rejecting_without_reason_is_422_and_unknown_application_404(
    client: httpx.AsyncClient,
) -> None:
    app_id = (await client.post("/v1/tenant/applications", json=APPLICATION)).json()["id"]
    no_reason = await client.post(
        f"/v1/admin/tenant-applications/{app_id}/reject", json={}, headers=ADMIN
    )
    assert no_reason.status_code == 422
    missing = await client.post(
        f"/v1/admin/tenant-applications/{new_id('tapp')}/approve", headers=ADMIN
    )
    assert missing.status_code == 404
