"""`gpu-share agent` and the unisolated process sandbox: a provider's node runs strangers'
jobs, so it refuses to run them as plain processes unless its provider opts in."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_share.testing.live import Live
from gpu_share.testing.servers import free_port

pytestmark = pytest.mark.slow

# Neither sandbox can work: no bwrap on PATH, no Docker engine where the SDK looks.
NO_SANDBOX_ENV = {"PATH": "/nonexistent", "DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def agent_command(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_share.cli.main",
            "agent",
            "--server",
            f"http://127.0.0.1:{free_port()}",  # never reached: the agent stops before
            "--token",
            "gpu_et_never_used",
            "--data-dir",
            str(tmp_path / "agent"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        check=False,
    )


def refusal(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("gpu-share agent: ")]


def test_the_agent_refuses_the_process_sandbox_without_the_opt_in(tmp_path: Path) -> None:
    done = agent_command(tmp_path, "--sandbox", "process")
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = refusal(done.stdout)
    assert line.startswith("gpu-share agent: the process sandbox does not isolate jobs: ")
    assert "install bubblewrap" in line and "or Docker" in line
    assert "--allow-unisolated (GPUSHARE_AGENT_ALLOW_UNISOLATED=1)" in line
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "agent" / "identity.json").exists()


def test_an_agent_without_docker_or_bubblewrap_refuses_to_start_without_the_opt_in(
    tmp_path: Path,
) -> None:
    done = agent_command(tmp_path, env=NO_SANDBOX_ENV)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = refusal(done.stdout)
    assert line.startswith("gpu-share agent: neither Docker nor bubblewrap works here: ")
    assert "--allow-unisolated" in line
    assert "Traceback" not in done.stdout + done.stderr


async def node_sandboxes(live: Live, count: int) -> list[dict[str, Any]]:
    for _ in range(300):
        nodes: list[dict[str, Any]] = (await live.http.get("/v1/nodes")).json()
        if len(nodes) == count and all(n["status"] == "online" for n in nodes):
            return nodes
        for agent in live.agents:
            assert agent.process.poll() is None, agent.log
        await asyncio.sleep(0.1)
    raise AssertionError(f"nodes: {nodes}\n" + "\n".join(a.log for a in live.agents))


async def test_with_the_opt_in_the_agent_serves_as_a_node_shown_unisolated(live: Live) -> None:
    live.agent("flag", sandbox="process", allow_unisolated=True)
    live.agent(
        "env", sandbox="auto", env={**NO_SANDBOX_ENV, "GPUSHARE_AGENT_ALLOW_UNISOLATED": "1"}
    )
    nodes = await node_sandboxes(live, 2)
    assert [(n["sandbox"], n["isolated"]) for n in nodes] == [("process", False)] * 2
