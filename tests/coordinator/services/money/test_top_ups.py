"""Admin top-ups (docs/billing.md): one payment is one reference, credited once whatever
Idempotency-Key comes with it (or none); the same reference with another amount is a 409
that credits nothing; an amount the published pattern refuses is a 422 that stores
nothing. Balances are read from the books, which must still sum to zero."""

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.testing.factories import ADMIN, TenantHandle
from tests.protocol.test_money import OFF_PATTERN


async def top_up(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    amount: Any,
    reference: str = "wire-100",
    key: str | None = None,
) -> httpx.Response:
    headers = {**ADMIN, **({"Idempotency-Key": key} if key is not None else {})}
    return await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": amount, "reference": reference},
        headers=headers,
    )


async def books(app: FastAPI, tenant: TenantHandle) -> tuple[int, int]:
    """(the tenant's balance, how many top-ups were posted), the books checked to sum to 0."""
    async with app.state.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        posted = await session.scalar(
            select(func.count()).where(LedgerTransactionRow.kind == TransactionKind.TOP_UP.value)
        )
        return await ledger.balance(session, ledger.tenant_balance(tenant.id)), int(posted or 0)


async def legacy_keyed_top_up(
    app: FastAPI, tenant: TenantHandle, key: str, reference: str, micro: int
) -> None:
    """A top-up as those sent with an Idempotency-Key were once recorded: under the key."""
    async with app.state.replica.db.write() as session:
        await ledger.post(
            session,
            cause=f"top_up:{tenant.id}:key:{key}",
            kind=TransactionKind.TOP_UP,
            entries=ledger.transfer(ledger.WORLD, ledger.tenant_balance(tenant.id), micro),
            now=app.state.replica.clock.now(),
            details={"tenant_id": tenant.id, "amount_micro": micro, "reference": reference},
        )


async def test_one_wire_posted_under_new_or_no_idempotency_keys_is_credited_once(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    first = await top_up(client, tenant, "100", key="k-1")
    assert first.status_code == 201, first.text
    for key in ("k-2", None, "k-3", "k-1"):
        again = await top_up(client, tenant, "100", key=key)
        assert again.status_code == 200, (key, again.text)
        assert (again.json()["replayed"], again.json()["available"]) == (True, "100")
    assert await books(app, tenant) == (100_000_000, 1)


async def test_the_same_reference_with_another_amount_is_a_conflict_naming_both(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    assert (await top_up(client, tenant, "100")).status_code == 201
    for key in (None, "another-key"):
        refused = await top_up(client, tenant, "200", key=key)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "CONFLICT"
        assert "100 USDC" in error["message"] and "200 USDC" in error["message"]
        assert error["details"] == {"reference": "wire-100", "credited": "100", "amount": "200"}
    assert await books(app, tenant) == (100_000_000, 1)


async def test_a_retry_of_a_top_up_recorded_under_its_key_credits_nothing(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    """Top-ups sent with a key were once recorded under it; retrying one finds it."""
    await legacy_keyed_top_up(app, tenant, "k-old", "wire-100", 100_000_000)
    retry = await top_up(client, tenant, "100", key="k-old")
    assert (retry.status_code, retry.json()["replayed"]) == (200, True)
    assert (await top_up(client, tenant, "300", key="k-old")).status_code == 409
    assert await books(app, tenant) == (100_000_000, 1)
    other = await top_up(client, tenant, "5", reference="wire-101", key="k-old")
    assert other.status_code == 201  # another payment, whatever key it carries
    assert await books(app, tenant) == (105_000_000, 2)


@pytest.mark.parametrize("reference", ["wire-100", "INV \"7%\" _x\\' ->>'"])
@pytest.mark.parametrize("key", ["k-new", None])
async def test_a_payment_recorded_under_its_key_is_not_credited_again_under_another_or_none(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, key: str | None, reference: str
) -> None:
    """The reference decides, even for a top-up recorded under the key it came with: the
    same wire posted again with a new key (or none) finds it and credits nothing."""
    await legacy_keyed_top_up(app, tenant, "k-old", reference, 100_000_000)
    await legacy_keyed_top_up(app, tenant, "k-other", "wire-7", 7_000_000)  # another payment
    again = await top_up(client, tenant, "100", reference, key=key)
    assert again.status_code == 200, again.text
    assert (again.json()["replayed"], again.json()["available"]) == (True, "107")
    assert await books(app, tenant) == (107_000_000, 2)

    refused = await top_up(client, tenant, "300", reference, key=key)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert repr(reference) in error["message"] and "100 USDC" in error["message"]
    assert error["details"] == {"reference": reference, "credited": "100", "amount": "300"}
    assert await books(app, tenant) == (107_000_000, 2)


async def test_a_reference_that_only_another_tenant_used_is_credited(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    await legacy_keyed_top_up(app, other_tenant, "k-old", "wire-100", 100_000_000)
    made = await top_up(client, tenant, "100", key="k-new")
    assert (made.status_code, made.json()["available"]) == (201, "100")
    assert await books(app, tenant) == (100_000_000, 2)


@pytest.mark.parametrize("amount", OFF_PATTERN)
async def test_an_amount_off_the_published_pattern_is_422_and_credits_nothing(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, amount: str
) -> None:
    answer = await top_up(client, tenant, amount)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"][0]["loc"][-1] == "amount"
    assert await books(app, tenant) == (0, 0)
