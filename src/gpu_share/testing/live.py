"""A coordinator served on loopback with real agent processes, for end-to-end tests."""

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.replica.state import Replica
from gpu_share.testing.factories import create_provider, create_tenant
from gpu_share.testing.processes import AgentProcess

# A loaded machine can take this long to start an agent process (Python, imports, NVML).
AGENT_START_TIMEOUT_SEC = 60.0


class Live:
    """A coordinator served on loopback, an admin client, a tenant and agent processes."""

    def __init__(self, base_url: str, http: httpx.AsyncClient, tmp: Path) -> None:
        self.base_url = base_url
        self.http = http
        self.tmp = tmp
        self.agents: list[AgentProcess] = []
        self.tenant_headers: dict[str, str] = {}
        self.enrollment_token = ""
        # The served app's replica, for what a test stands in for by writing rows (a
        # passed hardware challenge: `testing/verification.py`); set by the fixture.
        self.replica: Replica | None = None

    async def setup(self) -> None:
        tenant = await create_tenant(self.http)
        self.tenant_headers = tenant.headers
        self.enrollment_token = (await create_provider(self.http)).enrollment_token

    def agent(self, name: str = "a", **kwargs: Any) -> AgentProcess:
        process = AgentProcess(
            self.base_url, self.enrollment_token, self.tmp / f"agent-{name}", **kwargs
        )
        self.agents.append(process)
        return process

    async def upload(self, data: bytes, kind: str) -> str:
        response = await self.http.post(
            "/v1/artifacts",
            params={"kind": kind, "content_sha256": hashlib.sha256(data).hexdigest()},
            content=data,
            headers=self.tenant_headers,
        )
        assert response.status_code == 201, response.text
        url: str = response.json()["url"]
        return url

    async def invoke(self, **body: Any) -> str:
        payload = {"runtime": "onnx_cpu", "inputs_url": "", "timeout_sec": 120, **body}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AGENT_START_TIMEOUT_SEC
        while True:  # until an agent has registered
            response = await self.http.post(
                "/v1/gpu/invoke", json=payload, headers=self.tenant_headers
            )
            if response.status_code != 503 or loop.time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert response.status_code == 202, response.text
        invoke_id: str = response.json()["id"]
        return invoke_id

    async def get(self, invoke_id: str) -> dict[str, Any]:
        body: dict[str, Any] = (
            await self.http.get(f"/v1/gpu/invokes/{invoke_id}", headers=self.tenant_headers)
        ).json()
        return body

    async def wait_for(
        self, invoke_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = 60
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = await self.get(invoke_id)
            if until(state):
                return state
            if loop.time() > deadline:
                logs = "\n".join(a.log[-3000:] for a in self.agents)
                raise AssertionError(f"invoke stuck at {state}\nagent logs:\n{logs}")
            await asyncio.sleep(0.1)

    async def finished(self, invoke_id: str, timeout: float = 60) -> dict[str, Any]:
        return await self.wait_for(
            invoke_id, lambda s: s["status"] in ("done", "failed", "timeout", "canceled"), timeout
        )

    async def logs(self, invoke_id: str) -> str:
        response = await self.http.get(
            f"/v1/gpu/invokes/{invoke_id}/logs", headers=self.tenant_headers
        )
        return response.text


def fast_settings(settings: Settings) -> Settings:
    settings.heartbeat_interval_sec = 0.5
    settings.lease_ttl_sec = 3.0
    settings.lease_sweep_interval_sec = 0.3
    settings.node_offline_after_sec = 5.0
    settings.run_background_loops = True
    return settings
