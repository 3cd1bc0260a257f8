"""Plain functions that make objects through the real API."""

from dataclasses import dataclass

import httpx

from gpu_share.protocol.invokes import HELLO_WORLD as HELLO_WORLD  # the tests submit it

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


@dataclass(frozen=True)
class ProviderHandle:
    id: str
    key: str
    enrollment_token: str


async def create_provider(client: httpx.AsyncClient, name: str = "GPU Farm") -> ProviderHandle:
    response = await client.post(
        "/v1/admin/providers",
        json={"name": name, "email": f"{name.replace(' ', '.').lower()}@example.com"},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return ProviderHandle(
        id=body["id"], key=body["api_key"], enrollment_token=body["enrollment_token"]
    )
