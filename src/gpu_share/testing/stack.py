"""The whole platform as a tenant meets it, for end-to-end tests of the SDK, the CLI and
the README: `gpu-share server` and `gpu-share agent` as child processes, nothing
in-process (`live.Live` is the in-process counterpart, for tests of the coordinator).

Blocking on purpose: what these tests drive (the blocking `Client`, the CLI, curl in a
shell) blocks too, so they need no event loop.
"""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

# Quick heartbeats and sweeps so a test sees nodes and requeues in seconds, not minutes.
FAST_SERVER_ENV = {
    "GPUSHARE_HEARTBEAT_INTERVAL_SEC": "0.5",
    "GPUSHARE_LEASE_TTL_SEC": "5",
    "GPUSHARE_LEASE_SWEEP_INTERVAL_SEC": "0.5",
    "GPUSHARE_NODE_OFFLINE_AFTER_SEC": "5",
}


class LiveStack:
    """The coordinator (SQLite in `root` unless `database_url`) and `agents` agent processes."""

    def __init__(
        self,
        root: Path,
        *,
        agents: int = 1,
        database_url: str | None = None,
        sandbox: str = "bwrap",
        startup_timeout: float = 60.0,
        workers: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        """`workers`: `gpu-share server --workers N` (PostgreSQL); `env`: more settings."""
        self.root = root
        self.workers = workers
        self.extra_env = env or {}
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.admin_key = TEST_ADMIN_KEY
        self.agent_count = agents
        self.database_url = database_url
        self.sandbox = sandbox
        self.startup_timeout = startup_timeout
        self.agents: list[AgentProcess] = []
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log = root / "server.log"
        self.http = httpx.Client(base_url=self.base_url, headers=ADMIN, timeout=30, trust_env=False)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **FAST_SERVER_ENV,
            "GPUSHARE_DATA_DIR": str(self.root / "server"),
            "GPUSHARE_ADMIN_KEY": self.admin_key,
            # As an operator sets it: the installer and mails take links from it alone.
            "GPUSHARE_PUBLIC_BASE_URL": self.base_url,
            "PYTHONUNBUFFERED": "1",
        }
        if self.database_url:
            env["GPUSHARE_DATABASE_URL"] = self.database_url
        env.update(self.extra_env)
        with self.server_log.open("ab") as log:
            self.server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpu_share.cli.main",
                    "server",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    "--workers",
                    str(self.workers),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._until(self._healthy, "the server to answer /health")
        if self.agent_count:
            token = self.enrollment_token()
            for n in range(self.agent_count):
                self.agents.append(
                    AgentProcess(
                        self.base_url, token, self.root / f"agent-{n}", sandbox=self.sandbox
                    )
                )
            self._until(self._agents_online, f"{self.agent_count} agent(s) to come online")

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(5)
        self.http.close()

    def enrollment_token(self) -> str:
        response = self.http.post(
            "/v1/admin/providers", json={"name": "Live GPU Farm", "email": "farm@example.com"}
        )
        response.raise_for_status()
        token: str = response.json()["enrollment_token"]
        return token

    def tenant_key(self, name: str = "Live Tenant") -> str:
        """A new tenant's key."""
        email = f"{name.replace(' ', '.').lower()}.{time.monotonic_ns()}@example.com"
        response = self.http.post("/v1/admin/tenants", json={"name": name, "email": email})
        response.raise_for_status()
        key: str = response.json()["api_key"]
        return key

    @property
    def logs(self) -> str:
        """Server and agent output, for assertion messages."""
        parts = [self.server_log.read_text(errors="replace")[-3000:]]
        parts += [agent.log[-3000:] for agent in self.agents]
        return "\n---\n".join(parts)

    def _healthy(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def _agents_online(self) -> bool:
        try:
            nodes = self.http.get("/v1/nodes").json()
        except httpx.TransportError:  # a connection a worker dropped: ask again
            return False
        return bool(sum(node["status"] == "online" for node in nodes) >= self.agent_count)

    def _until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            if self.server is not None and self.server.poll() is not None:
                raise RuntimeError(f"the server exited while waiting for {what}:\n{self.logs}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}:\n{self.logs}")
            time.sleep(0.05)
