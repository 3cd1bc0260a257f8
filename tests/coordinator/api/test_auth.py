"""SPEC §1.1: 401 for missing/malformed/unknown/revoked keys, 403 for the wrong role."""

import httpx
import pytest

from gpu_share.coordinator.core.ids import new_id
from gpu_share.testing.factories import ADMIN, TenantHandle, bearer


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "gpu_sk_nobearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer gpu_sk_" + "x" * 43},
        {"Authorization": "Bearer two words"},
    ],
    ids=["missing", "no-scheme", "empty", "basic", "unknown", "spaces"],
)
async def test_bad_keys_answer_401_in_the_error_shape(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    response = await client.get("/v1/artifacts", headers=headers)
    assert response.status_code == 401
    body = response.json()
    assert body["error"]["code"] == "UNAUTHORIZED"
    assert body["error"]["message"]
    assert response.headers["www-authenticate"] == "Bearer"


async def test_revoked_key_answers_401_from_the_next_request(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    assert (await client.get("/v1/artifacts", headers=tenant.headers)).status_code == 200
    revoked = await client.post(f"/v1/admin/keys/{tenant.key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    response = await client.get("/v1/artifacts", headers=tenant.headers)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


async def test_tenant_key_on_admin_endpoint_is_403(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await client.get("/v1/admin/tenants", headers=tenant.headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "FORBIDDEN"
    assert "admin key" in response.json()["error"]["message"]


async def test_admin_key_on_tenant_endpoint_is_403(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/artifacts", headers=ADMIN)
    assert response.status_code == 403


async def test_keys_carry_their_role_prefix_and_are_stored_hashed(
    client: httpx.AsyncClient, tenant: TenantHandle, app: object
) -> None:
    from sqlalchemy import select

    from gpu_share.coordinator.core.orm import ApiKeyRow

    assert tenant.key.startswith("gpu_sk_") and len(tenant.key) >= 40
    replica = app.state.replica  # type: ignore[attr-defined]
    async with replica.db.read() as session:
        stored = (await session.scalars(select(ApiKeyRow))).all()
    assert all(tenant.key not in (row.key_hash, row.prefix) for row in stored)
    assert any(tenant.key.startswith(row.prefix) for row in stored)


async def test_admin_cannot_revoke_the_key_it_calls_with(client: httpx.AsyncClient) -> None:
    listed = await client.get("/v1/admin/keys", params={"role": "admin"}, headers=ADMIN)
    assert listed.status_code == 200
    (own,) = listed.json()
    response = await client.post(f"/v1/admin/keys/{own['id']}/revoke", headers=ADMIN)
    assert response.status_code == 409
    assert (await client.get("/v1/admin/tenants", headers=ADMIN)).status_code == 200


async def test_revoking_an_unknown_key_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post(f"/v1/admin/keys/{new_id('key')}/revoke", headers=ADMIN)
    assert response.status_code == 404


async def test_another_key_for_a_tenant_works_and_old_one_can_be_revoked(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    issued = await client.post(f"/v1/admin/tenants/{tenant.id}/keys", headers=ADMIN)
    assert issued.status_code == 201
    new_key = issued.json()["api_key"]
    assert new_key != tenant.key
    await client.post(f"/v1/admin/keys/{tenant.key_id}/revoke", headers=ADMIN)
    assert (await client.get("/v1/artifacts", headers=bearer(new_key))).status_code == 200
    assert (await client.get("/v1/artifacts", headers=tenant.headers)).status_code == 401
    listed = await client.get("/v1/admin/tenants", headers=ADMIN)
    keys = next(t for t in listed.json() if t["id"] == tenant.id)["keys"]
    assert {k["id"] for k in keys if k["revoked_at"]} == {tenant.key_id}
    assert all("api_key" not in k for k in keys)


async def test_another_replica_stops_accepting_a_revoked_key_within_the_cache_ttl(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: object, clock: object
) -> None:
    from gpu_share.coordinator.app import create_app
    from gpu_share.coordinator.core.settings import Settings
    from gpu_share.testing.clock import FrozenClock

    assert isinstance(settings, Settings) and isinstance(clock, FrozenClock)
    other = create_app(settings, clock=clock)
    async with (
        other.router.lifespan_context(other),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=other), base_url="http://b") as replica,
    ):
        assert (await replica.get("/v1/artifacts", headers=tenant.headers)).status_code == 200
        await client.post(f"/v1/admin/keys/{tenant.key_id}/revoke", headers=ADMIN)
        assert (await client.get("/v1/artifacts", headers=tenant.headers)).status_code == 401
        # The other replica verified the key a moment ago and still trusts it …
        assert (await replica.get("/v1/artifacts", headers=tenant.headers)).status_code == 200
        clock.advance(settings.key_cache_ttl_sec + 0.1)
        # … for at most the cache's lifetime.
        assert (await replica.get("/v1/artifacts", headers=tenant.headers)).status_code == 401
