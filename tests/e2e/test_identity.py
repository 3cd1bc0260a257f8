"""Identity that sticks, with a real agent process (SPEC §3.8): an agent started again on
the same machine sends the same fingerprint, so one that lost its identity file (a
reinstall, its state wiped) registers as the node it was, not as a fresh one."""

import asyncio
from typing import Any

import pytest

from gpu_share.testing.factories import bearer, create_provider
from gpu_share.testing.live import AGENT_START_TIMEOUT_SEC, Live
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow


async def nodes_once(live: Live, key: str, seen: set[str] | None = None) -> list[dict[str, Any]]:
    """The provider's nodes once one registered (and, with `seen`, once it is heard from anew)."""

    async def listed() -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = (
            await live.http.get("/v1/provider/nodes", headers=bearer(key))
        ).json()
        return nodes

    return await eventually(
        listed,
        lambda nodes: nodes and (seen is None or {n["last_seen_at"] for n in nodes} - seen),
        what="an agent registered" if seen is None else "the node heard from anew",
        timeout=AGENT_START_TIMEOUT_SEC,
        every=0.2,
        detail=live.agent_logs,
    )


async def test_an_agent_that_lost_its_identity_file_registers_as_the_same_node(
    live: Live,
) -> None:
    provider = await create_provider(live.http, "Steady Farm")
    data_dir = live.tmp / "agent-steady"
    first = AgentProcess(live.base_url, provider.enrollment_token, data_dir)
    live.agents.append(first)
    (node,) = await nodes_once(live, provider.key)
    await asyncio.to_thread(first.stop)

    (data_dir / "identity.json").unlink()  # the agent must register again with its token
    again = AgentProcess(live.base_url, provider.enrollment_token, data_dir)
    live.agents.append(again)

    async def registered_or_ended() -> bool:
        return "it is node" in again.log or again.process.poll() is not None

    await eventually(
        registered_or_ended,
        what="the agent registered again",
        timeout=AGENT_START_TIMEOUT_SEC,
        detail=live.agent_logs,
    )
    assert f"this machine was registered before: it is node {node['id']}" in again.log, again.log
    listed = await nodes_once(live, provider.key, seen={node["last_seen_at"]})
    assert [n["id"] for n in listed] == [node["id"]]  # one machine, one node
    await asyncio.to_thread(again.stop)
