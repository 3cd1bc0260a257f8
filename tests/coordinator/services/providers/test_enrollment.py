"""Identity that sticks (SPEC §3.8; docs/operations.md, "Machine identity"): a machine that
registers again is its node again, with its record; hardware of a quarantined node, or
of another provider's live node, cannot register; a new node starts at its provider's
published score. Real databases, the real agent protocol over the in-process app."""

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.agent.client import Unauthorized
from gpu_share.coordinator.core.orm import ApiKeyRow, NodeRow
from gpu_share.coordinator.services.nodes.hardware import HELD_FOR
from gpu_share.coordinator.services.providers import reliability
from gpu_share.coordinator.services.providers.reliability_formula import NEUTRAL
from gpu_share.protocol import agent as wire
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ProviderHandle,
    TenantHandle,
    bearer,
    create_provider,
)
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from tests.coordinator.services.providers.test_benchmarks import measured_like, report
from tests.coordinator.services.providers.test_reliability import add_invoke, set_node

FINGERPRINT = "f1" * 32
ANOTHER_FINGERPRINT = "e2" * 32


def machine(fingerprint: str | None = FINGERPRINT, **kw: Any) -> wire.NodeInventory:
    return inventory(gpus=[H100], fingerprint=fingerprint, hostname="rack-1", **kw)


def agent_for(app: FastAPI, node_inventory: wire.NodeInventory) -> SimulatedAgent:
    return SimulatedAgent(
        "http://testserver", transport=httpx.ASGITransport(app=app), node_inventory=node_inventory
    )


async def node_row(app: FastAPI, node_id: str | None) -> NodeRow:
    async with app.state.replica.db.read() as session:
        row: NodeRow | None = await session.get(NodeRow, node_id)
        assert row is not None
        return row


async def node_count(app: FastAPI) -> int:
    async with app.state.replica.db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(NodeRow)) or 0)


async def register_raw(
    client: httpx.AsyncClient, token: str, node_inventory: wire.NodeInventory
) -> httpx.Response:
    body = wire.Registration(inventory=node_inventory).model_dump(mode="json")
    return await client.post("/v1/agent/register", json=body, headers=bearer(token))


async def new_token(client: httpx.AsyncClient, provider: ProviderHandle) -> str:
    issued = await client.post("/v1/provider/enrollment-tokens", headers=bearer(provider.key))
    assert issued.status_code == 201, issued.text
    token: str = issued.json()["token"]
    return token


@pytest.mark.parametrize(
    "again",
    ["same fingerprint, same token", "new fingerprint but a shared GPU, new token"],
)
async def test_a_machine_registering_again_is_its_node_again_with_its_record(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    clock: FrozenClock,
    again: str,
) -> None:
    first = agent_for(app, machine())
    node_id = await first.register(provider.enrollment_token)
    assert first.returning is False
    run = await first.client.report_benchmark(report(measured_like(H100, "h100-80gb")))
    await first.heartbeat()
    async with app.state.replica.db.write() as session:
        await reliability.refresh_all(session, clock.now())
    record = {
        "verification": {H100.uuid: {"model": H100.model, "at": clock.now().isoformat()}},
        "spot_checks": {"checked": 7, "matched": 7},
    }
    await set_node(app.state.replica.db, node_id, **record)
    before = await node_row(app, node_id)
    clock.advance(3600)

    if again.startswith("same"):
        second = agent_for(app, machine())
        token = provider.enrollment_token
    else:  # the OS was reinstalled: another fingerprint, the same GPU
        second = agent_for(app, machine(ANOTHER_FINGERPRINT))
        token = await new_token(client, provider)
    assert await second.register(token) == node_id
    assert second.returning is True

    with pytest.raises(Unauthorized):  # the key it had is revoked
        await first.heartbeat()
    await second.heartbeat()  # the new one works
    after = await node_row(app, node_id)
    assert after.reliability == before.reliability and after.reliability is not None
    assert after.benchmark_state == before.benchmark_state
    assert (after.verification, after.spot_checks) == (
        record["verification"],
        record["spot_checks"],
    )
    assert after.registered_at == before.registered_at
    assert after.fingerprint == second.inventory.fingerprint  # kept current
    history = await client.get(
        f"/v1/provider/nodes/{node_id}/benchmarks", headers=bearer(provider.key)
    )
    assert [r["id"] for r in history.json()] == [run.id]
    assert await node_count(app) == 1
    async with app.state.replica.db.read() as session:
        keys = (await session.scalars(select(ApiKeyRow).where(ApiKeyRow.node_id == node_id))).all()
    assert sorted(k.revoked_at is None for k in keys) == [False, True]  # one old, one live
    await first.aclose()
    await second.aclose()


async def test_a_quarantined_machine_cannot_register_again_under_any_provider(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    caught = agent_for(app, machine())
    node_id = await caught.register(provider.enrollment_token)
    await set_node(
        app.state.replica.db, node_id, quarantined_at=clock.now(), quarantine_reason="mismatch"
    )
    clock.advance(2 * HELD_FOR.total_seconds())  # long silent: no other rule holds it

    again = await register_raw(client, provider.enrollment_token, machine())
    assert again.status_code == 403, again.text
    error = again.json()["error"]
    assert error["code"] == "FORBIDDEN" and "quarantined" in error["message"]
    assert error["details"] == {"reason": "hardware_quarantined", "node_id": node_id}

    other = await create_provider(client, "Fresh Start Ltd")
    elsewhere = await register_raw(client, other.enrollment_token, machine(ANOTHER_FINGERPRINT))
    assert elsewhere.status_code == 403, elsewhere.text  # its GPU gives it away
    assert elsewhere.json()["error"]["details"] == {
        "reason": "hardware_quarantined",
        "node_id": None,  # another provider's node is not named to this one
    }
    same_box = await register_raw(
        client, other.enrollment_token, inventory(fingerprint=FINGERPRINT)
    )
    assert same_box.status_code == 403  # no GPU listed now: its fingerprint gives it away
    assert await node_count(app) == 1
    await caught.aclose()


async def test_hardware_of_another_providers_live_node_is_refused_until_it_goes_silent(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    owner = agent_for(app, machine())
    node_id = await owner.register(provider.enrollment_token)
    other = await create_provider(client, "Second Hand GPUs")

    refused = await register_raw(client, other.enrollment_token, machine(ANOTHER_FINGERPRINT))
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["details"] == {"reason": "hardware_registered_elsewhere"}
    assert f"GPU {H100.uuid}" in error["message"] and "another provider's node" in error["message"]
    assert await node_count(app) == 1  # nothing made

    clock.advance(HELD_FOR.total_seconds() + 60)  # the owner's agent stopped a day ago
    moved = await register_raw(client, other.enrollment_token, machine(ANOTHER_FINGERPRINT))
    assert moved.status_code == 201, moved.text
    assert moved.json()["node_id"] != node_id and moved.json()["returning"] is False
    assert (await node_row(app, node_id)).provider_id == provider.id  # the old record stays
    await owner.aclose()


async def test_a_new_node_starts_at_its_providers_published_score_not_the_neutral_one(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    clock: FrozenClock,
) -> None:
    db = app.state.replica.db
    first = agent_for(app, machine())
    first_id = await first.register(provider.enrollment_token)
    assert ((await node_row(app, first_id)).reliability or {})[
        "score"
    ] == NEUTRAL  # none to inherit
    await set_node(db, first_id, registered_at=clock.now() - timedelta(days=10))
    for hours in range(1, 9):  # jobs lost on the machine, the provider's fault
        await add_invoke(db, tenant.id, first_id, clock.now() - timedelta(hours=hours), "NODE_LOST")
    async with db.write() as session:
        published = await reliability.refresh_all(session, clock.now())
    poor = published.providers[provider.id]
    assert poor is not None and poor.score < 0.6

    fresh = agent_for(app, inventory(gpus=[H100], fingerprint=ANOTHER_FINGERPRINT, machine="b"))
    fresh_id = await fresh.register(provider.enrollment_token)  # "a new machine"
    assert fresh.returning is False and fresh_id != first_id
    started = (await node_row(app, fresh_id)).reliability
    assert started is not None
    assert started["score"] == pytest.approx(poor.score, abs=1e-6)
    assert started["start"] == pytest.approx(poor.score, abs=1e-6)
    offered = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    by_id = {n["id"]: n["reliability_score"] for n in offered}
    assert by_id[fresh_id] == pytest.approx(poor.score, abs=1e-6)  # ranked by it, not by 0.9

    clock.advance(60)
    async with db.write() as session:
        again = await reliability.refresh_all(session, clock.now())
    fresh_score = again.nodes[fresh_id]
    assert fresh_score is not None and fresh_score.start == pytest.approx(poor.score, abs=1e-6)
    assert fresh_score.score == pytest.approx(poor.score, abs=1e-3)  # the loop keeps the start
    await first.aclose()
    await fresh.aclose()


async def test_a_node_cannot_take_in_a_quarantined_nodes_gpu_by_updating_its_inventory(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    caught = agent_for(app, machine())
    caught_id = await caught.register(provider.enrollment_token)
    await set_node(
        app.state.replica.db, caught_id, quarantined_at=clock.now(), quarantine_reason="mismatch"
    )
    other_gpu = H100.model_copy(update={"uuid": "GPU-00000000-0000-0000-0000-0000000000aa"})
    other = await create_provider(client, "Fresh Start Ltd")
    fresh = agent_for(app, inventory(gpus=[other_gpu], fingerprint=ANOTHER_FINGERPRINT))
    fresh_id = await fresh.register(other.enrollment_token)
    before = await node_row(app, fresh_id)

    # The same box, now saying it has the quarantined node's GPU (and its own).
    moved = inventory(
        gpus=[other_gpu, H100.model_copy(update={"index": 1})], fingerprint=ANOTHER_FINGERPRINT
    )
    assert fresh.client.key is not None
    refused = await client.put(
        "/v1/agent/inventory", json=moved.model_dump(mode="json"), headers=bearer(fresh.client.key)
    )
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["details"] == {"reason": "hardware_quarantined", "node_id": None}
    assert f"GPU {H100.uuid}" in error["message"]
    assert (await node_row(app, fresh_id)).gpus == before.gpus  # nothing taken in

    # Nor its fingerprint, with no GPU of it listed.
    same_box = inventory(gpus=[other_gpu], fingerprint=FINGERPRINT)
    refused = await client.put(
        "/v1/agent/inventory",
        json=same_box.model_dump(mode="json"),
        headers=bearer(fresh.client.key),
    )
    assert refused.status_code == 403, refused.text
    assert (await node_row(app, fresh_id)).fingerprint == ANOTHER_FINGERPRINT

    # Its own hardware, reported again, is always fine.
    kept = await client.put(
        "/v1/agent/inventory",
        json=fresh.inventory.model_dump(mode="json"),
        headers=bearer(fresh.client.key),
    )
    assert kept.status_code == 200, kept.text
    await caught.aclose()
    await fresh.aclose()


async def test_a_node_cannot_take_in_a_gpu_another_providers_live_node_holds(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    owner = agent_for(app, machine())
    await owner.register(provider.enrollment_token)
    other_gpu = H100.model_copy(update={"uuid": "GPU-00000000-0000-0000-0000-0000000000bb"})
    other = await create_provider(client, "Second Hand GPUs")
    fresh = agent_for(app, inventory(gpus=[other_gpu], fingerprint=ANOTHER_FINGERPRINT))
    await fresh.register(other.enrollment_token)
    assert fresh.client.key is not None
    moved = inventory(
        gpus=[other_gpu, H100.model_copy(update={"index": 1})], fingerprint=ANOTHER_FINGERPRINT
    )
    refused = await client.put(
        "/v1/agent/inventory", json=moved.model_dump(mode="json"), headers=bearer(fresh.client.key)
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["details"] == {"reason": "hardware_registered_elsewhere"}
    await owner.aclose()
    await fresh.aclose()
