"""The SDK's reservation calls against the real coordinator in-process: quote, reserve,
list, get and cancel; refusals as the SDK's errors; work that names a reservation."""

from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI

from gpu_share import AsyncClient, Conflict, NotFound, ValidationError
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.reservations import Reservation, ReservationQuote, ReservationStatus
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.rentals import MODEL, Rentals

MNIST = str(HELLO_WORLD["model_url"])


@pytest.fixture
async def other_sdk(app: FastAPI, other_tenant: TenantHandle) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(
        "http://testserver",
        other_tenant.key,
        transport=httpx.ASGITransport(app=app),
        retry=RetryPolicy(backoff_base=0.01),
    ) as client:
        yield client


async def test_quote_reserve_list_get_and_cancel_round_trip(
    sdk: AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=2)
    node_id = agent.node_id
    assert node_id is not None
    await rentals.top_up(tenant, "20")
    later = (clock.now() + timedelta(hours=2)).replace(second=0)

    quoted = await sdk.quote_reservation(node_id=node_id, gpus=2, starts_at=later, hours=3)
    assert isinstance(quoted, ReservationQuote)
    assert (quoted.node_id, quoted.gpus, quoted.gpu_model) == (node_id, 2, MODEL)
    assert (quoted.starts_at, quoted.hours, quoted.cost, quoted.covered) == (later, 3, "12", True)
    assert await rentals.balances(tenant) == (20_000_000, 0)  # a quote holds nothing

    made = await sdk.reserve(node_id=node_id, gpus=2, starts_at=later.isoformat(), hours=3)
    assert isinstance(made, Reservation)
    assert (made.status, made.cost, sorted(made.gpu_indices)) == (
        ReservationStatus.PENDING,
        "12",
        [0, 1],
    )
    assert await rentals.balances(tenant) == (8_000_000, 12_000_000)

    page = await sdk.reservations()
    assert [r.id for r in page.items] == [made.id]
    assert await sdk.get_reservation(made.id) == made

    canceled = await sdk.cancel_reservation(made.id)
    assert (canceled.status, canceled.cost) == (ReservationStatus.CANCELED, "0")  # not started
    assert await rentals.balances(tenant) == (20_000_000, 0)
    assert (await sdk.get_reservation(made.id)).status is ReservationStatus.CANCELED


async def test_refusals_arrive_as_the_sdk_errors_with_the_servers_message(
    sdk: AsyncClient,
    other_sdk: AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=1)
    node_id = agent.node_id
    assert node_id is not None
    await rentals.top_up(tenant, "20")
    with pytest.raises(ValidationError, match="hours: Input should be greater than") as bad:
        await sdk.reserve(node_id=node_id, hours=0)
    assert bad.value.status is None  # checked with the server's model: never sent
    with pytest.raises(ValidationError, match="`hours` or its `ends_at`"):  # the server's
        await sdk.quote_reservation(node_id=node_id)

    made = await sdk.reserve(node_id=node_id, hours=2)
    with pytest.raises(Conflict, match="reserved for part of") as overlapping:
        await sdk.reserve(node_id=node_id, hours=1)
    assert overlapping.value.details["constraint"] == "reserved"
    assert [r.id for r in (await sdk.reservations()).items] == [made.id]

    with pytest.raises(NotFound, match=f"reservation {made.id} does not exist"):
        await other_sdk.get_reservation(made.id)
    with pytest.raises(NotFound):
        await other_sdk.cancel_reservation(made.id)
    assert (await other_sdk.reservations()).items == []

    await sdk.cancel_reservation(made.id)
    with pytest.raises(Conflict, match="already canceled"):
        await sdk.cancel_reservation(made.id)


async def test_an_invoke_names_the_reservation_it_runs_in(
    sdk: AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    agent = await rentals.node(count=1)
    node_id = agent.node_id
    assert node_id is not None
    await rentals.top_up(tenant, "5")
    made = await sdk.reserve(node_id=node_id, hours=1)
    queued = await sdk.invoke("onnx_cuda", MNIST, reservation_id=made.id)
    assert (queued.reservation_id, queued.status) == (made.id, InvokeStatus.QUEUED)
    await sdk.cancel_reservation(made.id)
    # work still queued in a reservation that is over can never start
    assert (await sdk.get_invoke(queued.id)).status is not InvokeStatus.QUEUED
