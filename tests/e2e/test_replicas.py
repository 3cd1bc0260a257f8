"""Two coordinator replicas on one PostgreSQL and one S3 bucket, a real agent connected to
the first: sessions opened, used and closed through the second are relayed to the first,
which holds the node's channel (`replica.peers`, `api.relay`), over a link only a peer opens."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.orm import NodeChannelRow, ReplicaRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.http.relay_frames import (
    HANDSHAKE_HEAD_BYTES,
    Frame,
    address,
    read_frame,
    write_frame,
)
from gpu_share.coordinator.replica.peers import PURPOSE
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.live import Live, fast_settings
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.s3 import S3Endpoint
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.waiting import eventually
from tests.e2e.test_sessions import forward, npz, npz_bytes, state_of

pytestmark = pytest.mark.slow

ROWS = np.load(DIGITS_INPUTS)["input"]


@pytest.fixture
def settings(settings: Settings, s3_endpoint: S3Endpoint) -> Settings:
    if settings.database_url.startswith("sqlite"):
        pytest.skip("replicas share PostgreSQL; a SQLite file serves one process")
    settings.relay_host = "127.0.0.1"
    return s3_endpoint.use_for(settings)


class Replicas:
    def __init__(self, first: Live, second: Live, apps: list[FastAPI]) -> None:
        self.first = first  # the agent's
        self.second = second  # the tenant's
        self.apps = apps


@pytest.fixture
async def replicas(settings: Settings, tmp_path: Path) -> AsyncIterator[Replicas]:
    async with contextlib.AsyncExitStack() as stack:
        lives = []
        apps = []
        for name in ("first", "second"):
            port = free_port()
            own = fast_settings(
                settings.model_copy(
                    update={
                        "public_base_url": f"http://127.0.0.1:{port}",
                        "data_dir": tmp_path / name,
                    }
                )
            )
            app = create_app(own, clock=SystemClock())
            base_url = await stack.enter_async_context(serve(app, port))
            http = await stack.enter_async_context(
                httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30)
            )
            live = Live(base_url, http, tmp_path / name)
            live.replica = app.state.replica
            lives.append(live)
            apps.append(app)
        await lives[1].setup()
        harness = Replicas(lives[0], lives[1], apps)
        try:
            yield harness
        finally:
            for agent in lives[1].agents:
                await asyncio.to_thread(agent.stop)


def agent_on_first(replicas: Replicas) -> AgentProcess:
    tenant_side = replicas.second
    agent = AgentProcess(
        replicas.first.base_url, tenant_side.enrollment_token, tenant_side.tmp / "agent"
    )
    tenant_side.agents.append(agent)
    return agent


async def test_a_session_opened_and_used_through_another_replica(replicas: Replicas) -> None:
    agent_on_first(replicas)
    live = replicas.second
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    session = await live.create_session({"runtime": "onnx_cpu", "model_url": model_url})
    assert session["status"] == "ready", session

    first, second = (app.state.replica for app in replicas.apps)
    assert first.hub.get(session["id"]) is not None  # held where the channel is
    assert second.hub.get(session["id"]) is None
    async with second.db.read() as db:
        channel = (await db.scalars(select(NodeChannelRow))).one()
        known = set((await db.scalars(select(ReplicaRow.id))).all())
    assert channel.replica_id == first.id and known == {first.id, second.id}

    for i in range(10):
        rows = ROWS[i % 8 : i % 8 + 1]
        response = await forward(live, session["id"], npz_bytes(input=rows))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        assert npz(response.content)["label"].tolist() == DIGITS_EXPECTED_LABELS[i % 8 : i % 8 + 1]
    as_json = await forward(live, session["id"], {"inputs": {"input": ROWS.tolist()}})
    assert as_json.status_code == 200
    assert as_json.json()["outputs"]["label"] == DIGITS_EXPECTED_LABELS

    # A refusal on the holder reaches the tenant as the holder gave it.
    bad = await forward(live, session["id"], {"inputs": {"nope": [[1.0]]}})
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"]["details"]["session"] == "still usable"
    stranger = await live.http.post(
        "/v1/admin/tenants", json={"name": "other", "email": "other@example.com"}
    )
    other_key = {"Authorization": f"Bearer {stranger.json()['api_key']}"}
    assert (
        await forward(live, session["id"], npz_bytes(input=ROWS[:1]), other_key)
    ).status_code == 404

    await eventually(  # the holder flushes its counters; any replica reads them
        lambda: state_of(live, session["id"]),
        lambda state: state["forward_count"] == 12,
        what="the forwards counted",
    )
    closed = await live.http.delete(
        f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers
    )
    assert closed.json()["status"] == "closed"
    assert first.hub.get(session["id"]) is None  # the holder let it go
    after = await forward(live, session["id"], npz_bytes(input=ROWS[:1]))
    assert after.status_code == 410
    assert after.json()["error"]["code"] == "SESSION_CLOSED"


async def test_a_relay_link_without_a_peers_proof_is_refused(replicas: Replicas) -> None:
    first = replicas.apps[0].state.replica
    assert first.relay_url is not None
    reader, writer = await asyncio.open_connection(*address(first.relay_url))
    limits = {"max_head": HANDSHAKE_HEAD_BYTES, "max_body": 0}
    nonce = (await read_frame(reader, **limits)).head["nonce"]
    write_frame(writer, Frame({"proof": UrlSigner(b"x" * 32).seal(PURPOSE, nonce)}))
    refused = await read_frame(reader, **limits)
    assert refused.head["refusal"]["code"] == "UNAUTHORIZED"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and closed
