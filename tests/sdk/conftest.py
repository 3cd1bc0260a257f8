"""An SDK client of the coordinator in-process, and simulated agents that serve it."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, inventory

Behaviour = Callable[[wire.LeasedJob], Awaitable[wire.ResultReport]]


@pytest.fixture
async def sdk(app: FastAPI, tenant: TenantHandle) -> AsyncIterator[AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(
        "http://testserver",
        tenant.key,
        transport=transport,
        poll_interval=0.02,
        retry=RetryPolicy(backoff_base=0.01),
    ) as client:
        yield client


@pytest.fixture
async def serving(
    sim_agent: AgentFactory,
) -> AsyncIterator[Callable[..., Awaitable[SimulatedAgent]]]:
    """Start a simulated agent (serving `runtimes`) that completes every job with `behaviour`."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def start(
        behaviour: Behaviour | None = None, *, runtimes: list[RuntimeName] | None = None
    ) -> SimulatedAgent:
        agent = await sim_agent(inventory(runtimes=runtimes) if runtimes else None)
        tasks.append(asyncio.create_task(agent.serve(stop, behaviour)))
        return agent

    yield start
    stop.set()
    for task in tasks:  # rather than wait out a long-poll
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
