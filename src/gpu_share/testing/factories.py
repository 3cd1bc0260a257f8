"""Plain functions that make objects through the real API."""

from dataclasses import dataclass

import httpx

TEST_ADMIN_KEY = "gpu_admin_" + "test0admin0key0" * 3


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ADMIN = bearer(TEST_ADMIN_KEY)


@dataclass(frozen=True)
class TenantHandle:
    id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.key)


async def create_tenant(client: httpx.AsyncClient, name: str = "Acme ML") -> TenantHandle:
    response = await client.post(
        "/v1/admin/tenants",
        json={"name": name, "email": f"{name.replace(' ', '.').lower()}@example.com"},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return TenantHandle(id=body["id"], key=body["api_key"], key_id=body["key_id"])
