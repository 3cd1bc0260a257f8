"""Enrollment tokens that die (SPEC §3.8): they expire (`GPUSHARE_ENROLLMENT_TOKEN_DAYS`,
here 3, or the admin's choice), can be revoked and rotated by the provider and the admin,
and say how many machines each enrolled; machines they registered keep working."""

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.providers.enrollment_tokens import MAX_ACTIVE
from gpu_share.protocol import agent as wire
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ADMIN,
    ProviderHandle,
    TenantHandle,
    bearer,
    create_provider,
)
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from tests.coordinator.services.providers.test_enrollment import agent_for, register_raw

DAYS = 3
TOKENS = "/v1/provider/enrollment-tokens"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.enrollment_token_days = DAYS
    return settings


def box(name: str) -> wire.NodeInventory:
    """A CPU machine of its own (its fingerprint names it)."""
    return inventory(hostname=name, fingerprint=name.encode().hex().ljust(64, "0")[:64])


async def tokens_of(client: httpx.AsyncClient, provider: ProviderHandle) -> dict[str, Any]:
    listed = await client.get(TOKENS, headers=bearer(provider.key))
    assert listed.status_code == 200, listed.text
    return {t["prefix"]: t for t in listed.json()}


def prefix(token: str) -> str:
    return token[: len("gpu_et_") + 6]


async def test_a_token_expires_after_the_configured_days_and_its_machines_keep_working(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    (listed,) = (await tokens_of(client, provider)).values()
    assert listed["state"] == "active" and listed["machines"] == 0
    assert listed["expires_at"] == (clock.now() + timedelta(days=DAYS)).isoformat().replace(
        "+00:00", "Z"
    )
    agent = agent_for(app, box("early"))
    await agent.register(provider.enrollment_token)

    clock.advance(timedelta(days=DAYS).total_seconds())
    late = await register_raw(client, provider.enrollment_token, box("late"))
    assert late.status_code == 401, late.text
    error = late.json()["error"]
    assert error["code"] == "UNAUTHORIZED" and error["details"]["reason"] == "expired"
    assert "expired on" in error["message"] and "/provider" in error["message"]
    assert "POST /v1/provider/enrollment-tokens" in error["message"]
    await agent.heartbeat()  # the node's own key does not expire with the token
    (listed,) = (await tokens_of(client, provider)).values()
    assert (listed["state"], listed["machines"]) == ("expired", 1)
    await agent.aclose()


async def test_a_revoked_token_registers_nothing(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    (listed,) = (await tokens_of(client, provider)).values()
    revoked = await client.post(f"{TOKENS}/{listed['id']}/revoke", headers=bearer(provider.key))
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["state"] == "revoked" and revoked.json()["revoked_at"] is not None
    again = await client.post(f"{TOKENS}/{listed['id']}/revoke", headers=bearer(provider.key))
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]  # changes nothing

    refused = await register_raw(client, provider.enrollment_token, box("after"))
    assert refused.status_code == 401
    assert refused.json()["error"]["details"]["reason"] == "revoked"
    assert "was revoked on" in refused.json()["error"]["message"]
    unknown = await register_raw(client, "gpu_et_" + "x" * 43, box("guess"))
    assert unknown.status_code == 401 and "unknown" in unknown.json()["error"]["message"]


async def test_rotating_refuses_the_old_token_and_the_new_one_works(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    (old,) = (await tokens_of(client, provider)).values()
    rotated = await client.post(f"{TOKENS}/{old['id']}/rotate", headers=bearer(provider.key))
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["replaces"] == old["id"] and new["id"] != old["id"]
    assert new["token"].startswith("gpu_et_") and new["token"] in new["install_command"]
    assert new["state"] == "active"

    assert (await register_raw(client, provider.enrollment_token, box("a"))).status_code == 401
    agent = agent_for(app, box("b"))
    await agent.register(new["token"])
    states = {
        t["id"]: (t["state"], t["machines"]) for t in (await tokens_of(client, provider)).values()
    }
    assert states == {old["id"]: ("revoked", 0), new["id"]: ("active", 1)}
    twice = await client.post(f"{TOKENS}/{old['id']}/rotate", headers=bearer(provider.key))
    assert twice.status_code == 409 and "revoked already" in twice.json()["error"]["message"]
    await agent.aclose()


async def test_machines_count_against_the_token_they_registered_with_last(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    second = (await client.post(TOKENS, headers=bearer(provider.key))).json()["token"]
    agents: list[SimulatedAgent] = []
    for name, token in (("a", provider.enrollment_token), ("b", provider.enrollment_token)):
        agents.append(agent := agent_for(app, box(name)))
        await agent.register(token)
    agents.append(agent := agent_for(app, box("c")))
    await agent.register(second)
    counts = {p: t["machines"] for p, t in (await tokens_of(client, provider)).items()}
    assert counts == {prefix(provider.enrollment_token): 2, prefix(second): 1}

    again = agent_for(app, box("a"))  # machine a, registered again with the second token
    assert await again.register(second) == agents[0].node_id
    counts = {p: t["machines"] for p, t in (await tokens_of(client, provider)).items()}
    assert counts == {prefix(provider.enrollment_token): 1, prefix(second): 2}
    for each in (*agents, again):
        await each.aclose()


async def test_a_provider_cannot_touch_another_providers_tokens_and_roles_hold(
    client: httpx.AsyncClient, provider: ProviderHandle, tenant: TenantHandle
) -> None:
    other = await create_provider(client, "Neighbour")
    (theirs,) = (await tokens_of(client, other)).values()
    for action in ("revoke", "rotate"):
        answer = await client.post(
            f"{TOKENS}/{theirs['id']}/{action}", headers=bearer(provider.key)
        )
        assert answer.status_code == 404, answer.text
    made_up = await client.post(f"{TOKENS}/enr_{'0' * 26}/revoke", headers=bearer(provider.key))
    assert made_up.status_code == 404
    assert (
        await client.post(f"{TOKENS}/not-an-id/revoke", headers=bearer(provider.key))
    ).status_code == 422
    assert (await tokens_of(client, other))[theirs["prefix"]]["state"] == "active"
    mine = await tokens_of(client, provider)
    assert theirs["prefix"] not in mine and len(mine) == 1

    assert (await client.get(TOKENS)).status_code == 401
    assert (await client.get(TOKENS, headers=tenant.headers)).status_code == 403
    assert (await client.get(TOKENS, headers=ADMIN)).status_code == 403
    admin_path = f"/v1/admin/providers/{provider.id}/enrollment-tokens"
    assert (await client.get(admin_path, headers=bearer(provider.key))).status_code == 403
    assert (await client.post(admin_path, headers=tenant.headers)).status_code == 403
    (own,) = (await tokens_of(client, provider)).values()
    wrong = f"/v1/admin/providers/{other.id}/enrollment-tokens/{own['id']}/revoke"
    assert (await client.post(wrong, headers=ADMIN)).status_code == 404  # not that provider's


async def test_the_admin_issues_with_a_lifetime_of_their_choosing_rotates_and_revokes(
    client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    path = f"/v1/admin/providers/{provider.id}/enrollment-tokens"
    month = await client.post(path, json={"lifetime_days": 30}, headers=ADMIN)
    assert month.status_code == 201, month.text
    expires = (clock.now() + timedelta(days=30)).isoformat().replace("+00:00", "Z")
    assert month.json()["expires_at"] == expires
    default = await client.post(path, headers=ADMIN)  # no body: the platform's lifetime
    assert default.json()["expires_at"] == (clock.now() + timedelta(days=DAYS)).isoformat().replace(
        "+00:00", "Z"
    )
    for bad in (0, 366, "soon"):
        refused = await client.post(path, json={"lifetime_days": bad}, headers=ADMIN)
        assert refused.status_code == 422, refused.text
    rotated = await client.post(
        f"{path}/{month.json()['id']}/rotate", json={"lifetime_days": 2}, headers=ADMIN
    )
    assert rotated.status_code == 201 and rotated.json()["replaces"] == month.json()["id"]
    revoked = await client.post(f"{path}/{rotated.json()['id']}/revoke", headers=ADMIN)
    assert revoked.json()["state"] == "revoked"
    listed = (await client.get(path, headers=ADMIN)).json()
    assert [t["state"] for t in listed] == ["revoked", "active", "revoked", "active"]
    assert (
        await client.get(f"/v1/admin/providers/prv_{'0' * 26}/enrollment-tokens", headers=ADMIN)
    ).status_code == 404


async def test_a_provider_keeps_at_most_a_few_tokens_in_force(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    for _ in range(MAX_ACTIVE - 1):  # the first came with the account
        assert (await client.post(TOKENS, headers=bearer(provider.key))).status_code == 201
    over = await client.post(TOKENS, headers=bearer(provider.key))
    assert over.status_code == 409 and "revoke or rotate one" in over.json()["error"]["message"]
    some = next(iter((await tokens_of(client, provider)).values()))
    rotated = await client.post(f"{TOKENS}/{some['id']}/rotate", headers=bearer(provider.key))
    assert rotated.status_code == 201  # rotating keeps the count
