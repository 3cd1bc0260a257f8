"""`gpu-share server --workers 3` on PostgreSQL with a real agent: the three processes share
the port, so each new connection reaches any of them. Invokes run once each, a session's
forwards reach it from every worker (relayed to the one holding the node's channel), a
revoked key stops working everywhere, and when the holder is killed the session ends
with a clear code and the agent carries on through another worker."""

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from sqlalchemy import select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import NodeChannelRow, ReplicaRow
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.databases import empty_tables
from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

ROWS = np.load(DIGITS_INPUTS)["input"]


@pytest.fixture
def stack(postgres_database: str, tmp_path: Path) -> Iterator[LiveStack]:
    asyncio.run(empty_tables(postgres_database))
    with LiveStack(tmp_path, database_url=postgres_database, workers=3) as started:
        # /health answers once the first worker is up; the others may still be starting.
        deadline = time.monotonic() + 60
        while len(asyncio.run(_relays(postgres_database))[0]) < 3:
            assert time.monotonic() < deadline, f"3 workers did not register:\n{started.logs}"
            time.sleep(0.1)
        yield started


def fresh() -> httpx.Client:
    """A client that opens a new connection for every request: each may reach any worker."""
    return httpx.Client(
        timeout=60, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0)
    )


def npz_rows(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, input=rows)
    return buffer.getvalue()


def labels_of(data: bytes) -> list[int]:
    with np.load(io.BytesIO(data)) as archive:
        labels: list[int] = archive["label"].tolist()
        return labels


class Tenant:
    def __init__(self, http: httpx.Client, base: str, key: str) -> None:
        self.http = http
        self.base = base
        self.auth = {"Authorization": f"Bearer {key}"}

    def upload(self, data: bytes, kind: str) -> str:
        response = self.http.post(
            f"{self.base}/v1/artifacts", params={"kind": kind}, content=data, headers=self.auth
        )
        assert response.status_code == 201, response.text
        url: str = response.json()["url"]
        return url

    def run(self, model_url: str, inputs_url: str) -> dict[str, Any]:
        body = {"runtime": "onnx_cpu", "model_url": model_url, "inputs_url": inputs_url}
        invoke_id = self.http.post(f"{self.base}/v1/gpu/invoke", json=body, headers=self.auth)
        path = f"{self.base}/v1/gpu/invokes/{invoke_id.json()['id']}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state: dict[str, Any] = self.http.get(
                path, params={"wait": 20}, headers=self.auth
            ).json()
            if state["status"] in ("done", "failed", "timeout", "canceled"):
                return state
        raise AssertionError(f"{path} did not finish")

    def open_session(self, model_url: str) -> str:
        """A ready session's path, once an agent's channel is up."""
        body = {"runtime": "onnx_cpu", "model_url": model_url}
        deadline = time.monotonic() + 60
        while True:
            response = self.http.post(f"{self.base}/v1/gpu/sessions", json=body, headers=self.auth)
            if response.status_code == 201:
                break
            assert response.status_code == 503 and time.monotonic() < deadline, response.text
            time.sleep(0.2)
        path = f"{self.base}/v1/gpu/sessions/{response.json()['id']}"
        while self.http.get(path, headers=self.auth).json()["status"] == "starting":
            assert time.monotonic() < deadline, "the session did not load"
            time.sleep(0.05)
        assert self.http.get(path, headers=self.auth).json()["status"] == "ready"
        return path

    def forward(self, path: str, rows: np.ndarray) -> httpx.Response:
        return self.http.post(
            f"{path}/forward",
            content=npz_rows(rows),
            headers={**self.auth, "Content-Type": "application/octet-stream"},
        )


async def _relays(url: str) -> tuple[list[str], list[str]]:
    """Every worker's relay address, and those of the workers holding a node's channel."""
    db = Database(url)
    try:
        async with db.read() as session:
            everyone = (await session.scalars(select(ReplicaRow.relay_url))).all()
            holders = (
                await session.scalars(
                    select(ReplicaRow.relay_url).join(
                        NodeChannelRow, NodeChannelRow.replica_id == ReplicaRow.id
                    )
                )
            ).all()
        return [url or "" for url in everyone], [url or "" for url in holders]
    finally:
        await db.dispose()


def worker_listening_on(stack: LiveStack, port: int) -> psutil.Process:
    assert stack.server is not None
    for child in psutil.Process(stack.server.pid).children():
        if any(c.laddr.port == port for c in child.net_connections("tcp")):
            return child
    raise AssertionError(f"no worker listens on {port}")


def test_three_workers_share_invokes_sessions_and_keys(stack: LiveStack) -> None:
    created = stack.http.post("/v1/admin/tenants", json={"name": "t", "email": "t@example.com"})
    everyone, _ = asyncio.run(_relays(stack.database_url or ""))
    assert len(everyone) == 3 and all(url.startswith("relay://127.0.0.1:") for url in everyone)

    with fresh() as http:
        tenant = Tenant(http, stack.base_url, created.json()["api_key"])
        model_url = tenant.upload(DIGITS_MODEL.read_bytes(), "model")
        inputs_url = tenant.upload(DIGITS_INPUTS.read_bytes(), "inputs")

        # Invokes run once each, whichever worker took the submit, the lease or the result.
        for _ in range(6):
            state = tenant.run(model_url, inputs_url)
            assert (state["status"], state["attempts"]) == ("done", 1), state

        # The same Idempotency-Key, whichever worker each retry reaches: one invoke.
        body = {"runtime": "onnx_cpu", "model_url": model_url, "inputs_url": inputs_url}
        retried = {
            http.post(
                f"{stack.base_url}/v1/gpu/invoke",
                json=body,
                headers={**tenant.auth, "Idempotency-Key": "one-invoke"},
            ).json()["id"]
            for _ in range(6)
        }
        assert len(retried) == 1

        # A session, forwarded to from every worker.
        path = tenant.open_session(model_url)
        for i in range(24):  # the holder answering all 24 by chance: (1/3)^24
            answer = tenant.forward(path, ROWS[i % 8 : i % 8 + 1])
            assert answer.status_code == 200, answer.text
            assert labels_of(answer.content) == DIGITS_EXPECTED_LABELS[i % 8 : i % 8 + 1]

        # Its holder dies: the session ends with a clear code; the agent carries on.
        _, holders = asyncio.run(_relays(stack.database_url or ""))
        assert len(holders) == 1
        worker_listening_on(stack, int(holders[0].rsplit(":", 1)[1])).kill()
        deadline = time.monotonic() + 60
        while (ended := tenant.forward(path, ROWS[:1])).status_code != 410:
            assert ended.status_code in (200, 503) and time.monotonic() < deadline, ended.text
            time.sleep(0.1)
        error = ended.json()["error"]
        assert (error["code"], error["details"]["reason"]) == ("SESSION_CLOSED", "NODE_LOST")
        again = tenant.open_session(model_url)
        for _ in range(6):
            assert tenant.forward(again, ROWS[:1]).status_code == 200

        # A holder stopped cleanly (SIGTERM) ends its sessions at once, saying so; the
        # server starts the worker again.
        _, holders = asyncio.run(_relays(stack.database_url or ""))
        worker_listening_on(stack, int(holders[0].rsplit(":", 1)[1])).terminate()
        deadline = time.monotonic() + 60
        while (ended := tenant.forward(again, ROWS[:1])).status_code != 410:
            assert ended.status_code in (200, 503) and time.monotonic() < deadline, ended.text
            time.sleep(0.1)
        # The holder's hub answers 410 at once; its row is final a moment later.
        while (state := http.get(again, headers=tenant.auth).json())["status"] == "ready":
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        assert (state["status"], (state["error"] or {}).get("code")) == (
            "failed",
            "NODE_LOST",
        ), state
        # said as it happened: the process stopped (not its node's connection, which the
        # stopping server closes after)
        assert "coordinator process holding the session stopped" in state["error"]["message"]
        assert len(tenant.open_session(model_url)) > 0  # the agent reconnected again

        # A revoked key stops working on every worker (within the key cache's 5 s).
        revoked = stack.http.post(f"/v1/admin/keys/{created.json()['key_id']}/revoke")
        assert revoked.status_code == 200, revoked.text
        time.sleep(5.5)
        refused = [
            http.get(f"{stack.base_url}/v1/artifacts", headers=tenant.auth).status_code
            for _ in range(9)
        ]
        assert refused == [401] * 9

        # Failed key lookups are counted in the database: all workers together allow 30
        # a minute from one address (each alone would take these 31 as ~10 of its 30).
        stranger = {"Authorization": "Bearer gpu_live_" + "x" * 40}
        left = 60 - time.time() % 60  # windows start on the minute: all of these in one
        if left < 20:
            time.sleep(left + 0.5)
        answers = [
            http.get(f"{stack.base_url}/v1/artifacts", headers=stranger).status_code
            for _ in range(31)
        ]
        refused_from = answers.index(429)
        assert answers == [401] * refused_from + [429] * (31 - refused_from), answers
