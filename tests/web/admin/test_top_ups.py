"""The admin's top-up form on the Tenants page, over HTTP as a signed-in browser sends it:
an amount the published pattern refuses is shown beside that tenant's amount field and
credits nothing; the same payment sent twice is credited once."""

import re

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.services.money import ledger
from gpu_share.testing.factories import TEST_ADMIN_KEY, TenantHandle
from tests.protocol.test_money import OFF_PATTERN
from tests.web.admin.test_pages import signed_in


async def balance(app: FastAPI, tenant: TenantHandle) -> int:
    async with app.state.replica.db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        return await ledger.balance(session, ledger.tenant_balance(tenant.id))


@pytest.mark.parametrize("amount", OFF_PATTERN)
async def test_an_amount_off_the_pattern_is_shown_beside_its_field_and_credits_nothing(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, amount: str
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    answer = await client.post(
        f"/admin/tenants/{tenant.id}/top-ups",
        data={"csrf": csrf, "amount": amount, "reference": "wire-7"},
    )
    assert answer.status_code == 422, answer.text
    field = f"amount-{tenant.id}"
    error = re.search(rf'<p class="error" id="{field}-error">([^<]+)</p>', answer.text)
    assert error and "USDC" in error.group(1), answer.text
    assert f'id="{field}"' in answer.text and 'aria-invalid="true"' in answer.text
    assert await balance(app, tenant) == 0


async def test_a_form_sent_twice_credits_the_payment_once(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    csrf = await signed_in(client, TEST_ADMIN_KEY)
    form = {"csrf": csrf, "amount": "100", "reference": "wire-8"}
    first = await client.post(f"/admin/tenants/{tenant.id}/top-ups", data=form)
    again = await client.post(f"/admin/tenants/{tenant.id}/top-ups", data=form)
    assert (first.status_code, again.status_code) == (303, 303)
    page = await client.get(again.headers["location"])
    assert "Reference wire-8 was credited before; nothing added." in page.text
    other = await client.post(f"/admin/tenants/{tenant.id}/top-ups", data={**form, "amount": "200"})
    assert other.status_code == 409 and "credited before with 100 USDC" in other.text
    assert await balance(app, tenant) == 100_000_000
