"""Two of everyone for the cross-tenant matrix: tenants A and B, providers A and B, and
their nodes, where A owns one of everything it can own, made through the real API (an
artifact, a finished and a running invoke, a session, a reservation, keys, usage rows,
enrollment tokens, a hardware challenge, earnings and a payout) and B owns a little of
its own, so that B's lists have something in them.

What B must never see of A is gathered as `secrets`: the ids and the distinctive text
of A's objects."""

import hashlib
import json
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import ChallengeRow
from gpu_share.coordinator.loops import challenges as challenge_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import OpenSession, SessionStatus
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import post_charge
from gpu_share.testing.factories import (
    ADMIN,
    HELLO_WORLD,
    ProviderHandle,
    TenantHandle,
    bearer,
    create_provider,
    create_tenant,
)
from gpu_share.testing.models import identity_model
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified

SOLANA = {"kind": "solana_usdc", "address": "So11111111111111111111111111111111111111112"}


class LoadedChannel:
    """The agent's end of the session channel: says the model is loaded, as an agent would."""

    def __init__(self, replica: Replica) -> None:
        self.hub = replica.hub

    async def send_text(self, data: str) -> None:
        if json.loads(data)["type"] == "open":
            self.hub.settle(OpenSession.model_validate_json(data).session_id, SessionStatus.READY)

    async def send_bytes(self, data: bytes) -> None:
        raise AssertionError("the matrix forwards nothing to another's session")


@dataclass
class Side:
    """One side's callers and what they own, by path parameter name."""

    tenant: TenantHandle
    provider: ProviderHandle
    nodes: list[SimulatedAgent]
    owned: dict[str, list[str]] = field(default_factory=dict)  # "invoke_id": [ids]
    secrets: dict[str, set[str]] = field(default_factory=dict)  # by role of who must not see

    def key(self, role: Role) -> str:
        keys = {Role.TENANT: self.tenant.key, Role.PROVIDER: self.provider.key}
        if role is Role.AGENT:
            assert self.nodes[0].client.key is not None
            return self.nodes[0].client.key
        return keys[role]

    def headers(self, role: Role) -> dict[str, str]:
        return bearer(self.key(role))

    def own(self, param: str, value: str, *seen_by: Role) -> None:
        self.owned.setdefault(param, []).append(value)
        self.hide(value, *seen_by)

    def hide(self, value: str, *seen_by: Role) -> None:
        for role in seen_by or (Role.TENANT, Role.PROVIDER):
            self.secrets.setdefault(role, set()).add(value)


async def _node(app: FastAPI, provider: ProviderHandle, machine: str, count: int) -> SimulatedAgent:
    cards = [
        H100.model_copy(update={"index": n, "uuid": f"GPU-{machine}-{n:04d}"}) for n in range(count)
    ]
    agent = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),
        node_inventory=inventory(
            runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU],
            gpus=cards,
            slots=4,
            hostname=f"{machine}-host",
            fingerprint=hashlib.sha256(machine.encode()).hexdigest(),
        ),
    )
    await agent.register(provider.enrollment_token)
    return agent


async def _priced(
    client: httpx.AsyncClient, side: Side, agent: SimulatedAgent, app: FastAPI
) -> None:
    assert agent.node_id is not None
    await mark_verified(app.state.replica, agent.node_id)
    answer = await client.put(
        f"/v1/provider/prices/{H100.model}",
        json={"price_per_gpu_hour": "2", "spot_discount_pct": 50},
        headers=side.headers(Role.PROVIDER),
    )
    assert answer.status_code == 200, answer.text


async def _upload(client: httpx.AsyncClient, side: Side, data: bytes) -> dict[str, str]:
    sha = hashlib.sha256(data).hexdigest()
    made = await client.post(
        "/v1/artifacts",
        params={"kind": "model", "content_sha256": sha},
        content=data,
        headers=side.tenant.headers,
    )
    assert made.status_code == 201, made.text
    artifact: dict[str, str] = made.json()
    return artifact


async def _invoke(client: httpx.AsyncClient, side: Side) -> str:
    made = await client.post("/v1/gpu/invoke", json=HELLO_WORLD, headers=side.tenant.headers)
    assert made.status_code == 202, made.text
    invoke_id: str = made.json()["id"]
    return invoke_id


async def side(app: FastAPI, client: httpx.AsyncClient, name: str, *, rich: bool) -> Side:
    """A tenant, a provider with a verified, priced GPU node, and what they own; `rich`:
    one of everything (side A), else an artifact and a finished invoke (side B)."""
    tenant = await create_tenant(client, f"Tenant {name} Confidential")
    provider = await create_provider(client, f"Farm {name} Confidential")
    node = await _node(app, provider, f"machine-{name.lower()}", count=4)
    me = Side(tenant, provider, [node])
    assert node.node_id is not None
    me.hide(tenant.id, Role.TENANT, Role.PROVIDER)
    me.hide(f"Tenant {name} Confidential", Role.TENANT, Role.PROVIDER)
    me.own("key_id", tenant.key_id, Role.TENANT, Role.PROVIDER)
    me.hide(provider.id, Role.PROVIDER)
    me.hide(f"Farm {name} Confidential", Role.PROVIDER)
    me.own("node_id", node.node_id, Role.PROVIDER)
    me.hide(f"machine-{name.lower()}-host", Role.PROVIDER)
    await _priced(client, me, node, app)
    topped = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "100", "reference": f"wire-{name}"},
        headers=ADMIN,
    )
    assert topped.status_code in (200, 201), topped.text

    secret_input = f"confidential_input_of_{name.lower()}"  # shown with the artifact
    artifact = await _upload(client, me, identity_model(secret_input))
    me.own("artifact_id", artifact["id"], Role.TENANT, Role.PROVIDER)
    me.hide(artifact["sha256"], Role.TENANT, Role.PROVIDER)
    me.hide(secret_input, Role.TENANT, Role.PROVIDER)
    finished = await _invoke(client, me)
    (job,) = await node.lease(start=True)
    clock = app.state.replica.clock
    assert isinstance(clock, FrozenClock)
    clock.advance(90)  # a minute and a half of GPU time: a charge, usage rows, earnings
    await node.heartbeat([job])
    await node.complete(job, b"outputs of " + name.encode())
    me.own("invoke_id", finished, Role.TENANT, Role.PROVIDER)
    usage = await client.get("/v1/billing/usage.csv", headers=tenant.headers)
    assert finished in usage.text, usage.text
    if rich:
        await _everything_else(app, client, me)
    return me


async def _everything_else(app: FastAPI, client: httpx.AsyncClient, me: Side) -> None:
    replica: Replica = app.state.replica
    node = me.nodes[0]
    assert node.node_id is not None
    running = await _invoke(client, me)
    (job,) = await node.lease(start=True)
    await node.client.append_logs(running, job.lease_token, "a confidential log line\n")
    me.own("invoke_id", running, Role.TENANT, Role.PROVIDER)
    me.hide("a confidential log line", Role.TENANT, Role.PROVIDER)

    replica.hub.attach(node.node_id, LoadedChannel(replica))
    opened = await client.post(
        "/v1/gpu/sessions",
        json={"runtime": "onnx_cuda", "model_url": HELLO_WORLD["model_url"]},
        headers=me.tenant.headers,
    )
    assert opened.status_code == 201, opened.text
    me.own("session_id", opened.json()["id"], Role.TENANT, Role.PROVIDER)

    booked = await client.post(
        "/v1/reservations",
        json={"node_id": node.node_id, "gpus": 1, "hours": 2},
        headers=me.tenant.headers,
    )
    assert booked.status_code == 201, booked.text
    me.own("reservation_id", booked.json()["id"], Role.TENANT, Role.PROVIDER)

    issued = await client.post(
        "/v1/provider/enrollment-tokens", json={}, headers=me.headers(Role.PROVIDER)
    )
    assert issued.status_code == 201, issued.text
    tokens = await client.get("/v1/provider/enrollment-tokens", headers=me.headers(Role.PROVIDER))
    for token in tokens.json():
        me.own("token_id", token["id"], Role.PROVIDER)

    unproven = await _node(app, me.provider, "machine-a-unproven", count=1)  # challenged
    assert unproven.node_id is not None
    me.nodes.append(unproven)
    me.own("node_id", unproven.node_id, Role.PROVIDER)
    await challenge_loop.run_once(replica)
    async with replica.db.read() as session:
        challenged = await session.scalars(
            select(ChallengeRow.id).where(ChallengeRow.node_id == unproven.node_id)
        )
        for challenge_id in challenged:
            me.own("challenge_id", challenge_id, Role.PROVIDER, Role.AGENT)
    assert me.owned.get("challenge_id"), "the unproven node was not challenged"

    await _paid_out(client, me, replica)
    await _webhooks(client, me)


async def _webhooks(client: httpx.AsyncClient, me: Side) -> None:
    """A webhook endpoint of the tenant's and of the provider's, and a delivery to each (a
    top-up the tenant's endpoint is told of, the payout paid the provider's is told of)."""
    for role, path, event in (
        (Role.TENANT, "/v1/webhooks", "topup.credited"),
        (Role.PROVIDER, "/v1/provider/webhooks", "payout.paid"),
    ):
        made = await client.post(
            f"{path}/endpoints",
            json={"url": "https://hooks.example.com/confidential-hook", "event_types": [event]},
            headers=me.headers(role),
        )
        assert made.status_code == 201, made.text
        me.own("endpoint_id", made.json()["id"], Role.TENANT, Role.PROVIDER)
    me.hide("confidential-hook", Role.TENANT, Role.PROVIDER)
    topped = await client.post(
        f"/v1/admin/tenants/{me.tenant.id}/top-ups",
        json={"amount": "1", "reference": "wire-told"},
        headers=ADMIN,
    )
    assert topped.status_code in (200, 201), topped.text
    (told,) = (await client.get("/v1/webhooks/deliveries", headers=me.tenant.headers)).json()
    me.own("delivery_id", told["id"], Role.TENANT, Role.PROVIDER)
    payouts = await client.get("/v1/provider/payouts", headers=me.headers(Role.PROVIDER))
    paid = await client.post(
        f"/v1/admin/payouts/{payouts.json()[0]['id']}/paid",
        json={"reference": "confidential-reference"},
        headers=ADMIN,
    )
    assert paid.status_code == 200, paid.text
    told_provider = await client.get(
        "/v1/provider/webhooks/deliveries", headers=me.headers(Role.PROVIDER)
    )
    me.own("delivery_id", told_provider.json()[0]["id"], Role.TENANT, Role.PROVIDER)


async def _paid_out(client: httpx.AsyncClient, me: Side, replica: Replica) -> None:
    """Payable earnings (posted as billing posts them), a payout method, and a payout."""
    assert me.nodes[0].node_id is not None
    await post_charge(
        replica.db,
        me.provider.id,
        at=replica.clock.now(),
        provider_micro=7_000_000,
        node_id=me.nodes[0].node_id,
    )
    method = await client.put(
        "/v1/provider/payout-settings",
        json={"method": SOLANA, "schedule": "monthly"},
        headers=me.headers(Role.PROVIDER),
    )
    assert method.status_code == 200, method.text
    paid = await client.post(
        f"/v1/admin/providers/{me.provider.id}/payouts", json={"amount": "3"}, headers=ADMIN
    )
    assert paid.status_code == 201, paid.text
    me.hide(paid.json()["id"], Role.PROVIDER)
