"""A provider names their machines (`PATCH /v1/provider/nodes/{node_id}`): the label is
checked, only the owner may set it, and every list of nodes carries it, on both
databases."""

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle, create_provider
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.providers.test_enrollment import agent_for, machine


def path(node_id: str | None) -> str:
    return f"/v1/provider/nodes/{node_id}"


def bearer(provider: ProviderHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {provider.key}"}


async def stored_label(app: FastAPI, node_id: str | None) -> str | None:
    async with app.state.replica.db.read() as session:
        row: NodeRow | None = await session.get(NodeRow, node_id)
        assert row is not None
        return row.label


async def test_a_provider_labels_a_machine_and_every_node_list_shows_it(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent(verified=True)
    saved = await client.patch(
        path(agent.node_id), json={"label": "  rack 3 · A100 box "}, headers=bearer(provider)
    )
    assert saved.status_code == 200, saved.text
    assert (saved.json()["id"], saved.json()["label"]) == (agent.node_id, "rack 3 · A100 box")
    assert saved.json()["hostname"] == "sim-node"
    assert await stored_label(app, agent.node_id) == "rack 3 · A100 box"

    (mine,) = (await client.get("/v1/provider/nodes", headers=bearer(provider))).json()
    assert mine["label"] == "rack 3 · A100 box"
    (listed,) = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert listed["label"] == "rack 3 · A100 box"
    (offer,) = (await client.get("/v1/offers", headers=tenant.headers)).json()
    assert offer["label"] == "rack 3 · A100 box"
    reliability = (await client.get("/v1/provider/reliability", headers=bearer(provider))).json()
    assert reliability["nodes"][0]["label"] == "rack 3 · A100 box"

    cleared = await client.patch(
        path(agent.node_id), json={"label": None}, headers=bearer(provider)
    )
    assert cleared.status_code == 200 and cleared.json()["label"] is None
    assert await stored_label(app, agent.node_id) is None


async def test_a_label_survives_the_machine_registering_again(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    first = agent_for(app, machine())
    node_id = await first.register(provider.enrollment_token)
    await client.patch(path(node_id), json={"label": "kept"}, headers=bearer(provider))
    again = agent_for(app, machine())
    assert await again.register(provider.enrollment_token) == node_id and again.returning
    assert await stored_label(app, node_id) == "kept"
    await first.aclose()
    await again.aclose()


@pytest.mark.parametrize(
    ("label", "says"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("x" * 65, "at most 64 characters"),
        ("two\nlines", "printable"),
        ("bell\x07", "printable"),
    ],
)
async def test_a_bad_label_is_422_and_changes_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    label: str,
    says: str,
) -> None:
    agent = await sim_agent()
    response = await client.patch(
        path(agent.node_id), json={"label": label}, headers=bearer(provider)
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and says in error["message"]
    assert await stored_label(app, agent.node_id) is None


async def test_sixty_four_characters_is_long_enough(
    client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    response = await client.patch(
        path(agent.node_id), json={"label": "y" * 64}, headers=bearer(provider)
    )
    assert response.status_code == 200, response.text


async def test_another_providers_node_is_not_found_and_keeps_its_label(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    await client.patch(path(agent.node_id), json={"label": "mine"}, headers=bearer(provider))
    stranger = await create_provider(client, "Someone Else")
    response = await client.patch(
        path(agent.node_id), json={"label": "theirs"}, headers=bearer(stranger)
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"
    assert await stored_label(app, agent.node_id) == "mine"
    unknown = "nod_" + "0" * 26
    assert (
        await client.patch(path(unknown), json={"label": "x"}, headers=bearer(provider))
    ).status_code == 404
    assert (
        await client.patch(path("not-an-id"), json={"label": "x"}, headers=bearer(provider))
    ).status_code == 422
    for other in (tenant.headers, ADMIN):
        assert (
            await client.patch(path(agent.node_id), json={"label": "x"}, headers=other)
        ).status_code == 403
    assert await stored_label(app, agent.node_id) == "mine"
