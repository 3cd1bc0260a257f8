"""Fixtures: every database test runs on SQLite and on PostgreSQL.

`GPUSHARE_TEST_DATABASES=sqlite` limits a run to SQLite (PostgreSQL then need not
be running); CI runs both.
"""

import asyncio
import gc
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from gpu_share.coordinator import migrate
from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol import agent as wire
from gpu_share.testing.clock import FrozenClock, SystemClock
from gpu_share.testing.databases import (
    create_scratch_postgres,
    drop_scratch_postgres,
    empty_tables,
)
from gpu_share.testing.factories import (
    ADMIN,
    TEST_ADMIN_KEY,
    ProviderHandle,
    TenantHandle,
    create_provider,
    create_tenant,
)
from gpu_share.testing.live import Live, fast_settings
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.s3 import CREDENTIALS, S3Endpoint
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.simulated_agent import (
    AgentFactory,
    SimulatedAgent,
    inventory,
    own_gpus,
)
from gpu_share.testing.verification import mark_verified

DATABASES = [
    d.strip()
    for d in os.environ.get("GPUSHARE_TEST_DATABASES", "sqlite,postgres").split(",")
    if d.strip()
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `one_database` runs on the run's first database only: what it
    checks does not depend on the database (an agent's limits, a page's layout, headers
    or policy), and the queries behind it run on every database in the other tests."""
    first = DATABASES[0] if DATABASES else None
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on = callspec.params.get("db_url") if callspec is not None else None
        if item.get_closest_marker("one_database") and on is not None and on != first:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every module is imported now, and what they built lives until the end: frozen,
    the collector never walks it again. Each test then builds and drops an app (tens of
    thousands of objects in cycles), so collections come less often and each frees
    more: at the default thresholds the collector took a sixth of a run's time."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Everything is reported by now: what is left need not be collected on the way
    out (CPython's last collection at exit walks the whole heap), so freeze it and the
    process ends at once."""
    gc.freeze()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    asyncio.run(migrate.upgrade(f"sqlite+aiosqlite:///{path}"))
    return path


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    url = asyncio.run(create_scratch_postgres())
    try:
        asyncio.run(migrate.upgrade(url))
        yield url
    finally:
        asyncio.run(drop_scratch_postgres(url))


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """A real S3 HTTP endpoint (moto), its credentials in this process's environment the
    way the S3 store reads them."""
    endpoint = S3Endpoint.start(tmp_path_factory.mktemp("s3"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)
        try:
            yield endpoint
        finally:
            endpoint.stop()


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        target = tmp_path / "gpushare.db"
        shutil.copy(template, target)
        return f"sqlite+aiosqlite:///{target}"
    url: str = request.getfixturevalue("postgres_database")
    asyncio.run(empty_tables(url))
    return url


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
    )


@pytest.fixture
async def app(settings: Settings, clock: FrozenClock) -> AsyncIterator[FastAPI]:
    application = create_app(settings, clock=clock)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


@pytest.fixture
async def tenant(client: httpx.AsyncClient) -> TenantHandle:
    return await create_tenant(client, "Tenant One")


@pytest.fixture
async def other_tenant(client: httpx.AsyncClient) -> TenantHandle:
    return await create_tenant(client, "Tenant Two")


@pytest.fixture
async def provider(client: httpx.AsyncClient) -> ProviderHandle:
    return await create_provider(client)


@pytest.fixture
async def sim_agent(app: FastAPI, provider: ProviderHandle) -> AsyncIterator[AgentFactory]:
    """Registers simulated agents (real protocol, in-process transport) on demand, each a
    machine of its own (`own_gpus`); `verified=True`: its hardware passed its challenges
    (`testing/verification.py`), for tests about something else."""
    agents: list[SimulatedAgent] = []
    taken: set[str] = set()

    async def make(
        node_inventory: wire.NodeInventory | None = None, *, verified: bool = False
    ) -> SimulatedAgent:
        agent = SimulatedAgent(
            "http://testserver",
            transport=httpx.ASGITransport(app=app),
            node_inventory=own_gpus(node_inventory or inventory(), taken),
        )
        await agent.register(provider.enrollment_token)
        agents.append(agent)
        if verified:
            assert agent.node_id is not None
            await mark_verified(app.state.replica, agent.node_id)
        return agent

    yield make
    for agent in agents:
        await agent.aclose()


@pytest.fixture
def rentals(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> Rentals:
    """The provider's priced GPU nodes, tenants' top-ups and their reservations."""
    return Rentals(app.state.replica, client, provider, sim_agent)


@pytest.fixture
async def live(settings: Settings, tmp_path: Path) -> AsyncIterator[Live]:
    """A coordinator served on loopback (real clock, fast leases), a tenant and a provider."""
    port = free_port()
    # As an operator sets it: the installer and mails take links from it alone.
    settings.public_base_url = f"http://127.0.0.1:{port}"
    application = create_app(fast_settings(settings), clock=SystemClock())
    async with (
        serve(application, port) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30) as http,
    ):
        harness = Live(base_url, http, tmp_path)
        harness.replica = application.state.replica
        await harness.setup()
        try:
            yield harness
        finally:
            for agent in harness.agents:
                await asyncio.to_thread(agent.stop)  # the loop must keep serving meanwhile
