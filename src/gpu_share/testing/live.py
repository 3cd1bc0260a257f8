"""A coordinator served on loopback with real agent processes, for end-to-end tests."""

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.replica.state import Replica
from gpu_share.testing.factories import create_provider, create_tenant
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.waiting import WAIT_SEC, eventually

# A loaded machine can take this long to start an agent process (Python, imports, NVML).
AGENT_START_TIMEOUT_SEC = WAIT_SEC


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
        response = await eventually(
            lambda: self.http.post("/v1/gpu/invoke", json=payload, headers=self.tenant_headers),
            lambda answer: answer.status_code != 503,
            what="an agent registered to take the invoke",
            timeout=AGENT_START_TIMEOUT_SEC,
            detail=self.agent_logs,
        )
        assert response.status_code == 202, response.text
        invoke_id: str = response.json()["id"]
        return invoke_id

    async def get(self, invoke_id: str) -> dict[str, Any]:
        body: dict[str, Any] = (
            await self.http.get(f"/v1/gpu/invokes/{invoke_id}", headers=self.tenant_headers)
        ).json()
        return body

    async def wait_for(
        self, invoke_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = WAIT_SEC
    ) -> dict[str, Any]:
        return await eventually(
            lambda: self.get(invoke_id),
            until,
            what=f"invoke {invoke_id} got where the test waits for",
            timeout=timeout,
            detail=self.agent_logs,
        )

    async def finished(self, invoke_id: str, timeout: float = WAIT_SEC) -> dict[str, Any]:
        return await self.wait_for(
            invoke_id, lambda s: s["status"] in ("done", "failed", "timeout", "canceled"), timeout
        )

    async def create_session(
        self, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A session created (by the tenant, or whoever `headers` name) once an agent's
        session channel is up; its state once it is no longer starting."""
        headers = headers or self.tenant_headers
        response = await eventually(
            lambda: self.http.post("/v1/gpu/sessions", json=payload, headers=headers),
            lambda answer: answer.status_code != 503,
            what="an agent's session channel up",
            timeout=AGENT_START_TIMEOUT_SEC,
            detail=self.agent_logs,
        )
        assert response.status_code == 201, response.text
        path = f"/v1/gpu/sessions/{response.json()['id']}"

        async def state() -> dict[str, Any]:
            body: dict[str, Any] = (await self.http.get(path, headers=headers)).json()
            return body

        return await eventually(  # loading a model is slow on a busy machine
            state,
            lambda session: session["status"] != "starting",
            what="the session past starting",
            every=0.05,
            detail=self.agent_logs,
        )

    def agent_logs(self) -> str:
        """The end of each agent's log, for a failure to show."""
        return "agent logs:\n" + "\n".join(a.log[-3000:] for a in self.agents)

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
    # On-demand work stops spot work after a second in the queue, not ten: a spot job
    # under test need not outlast the production grace on a fast machine.
    settings.preemption_grace_sec = 1.0
    settings.run_background_loops = True
    return settings
