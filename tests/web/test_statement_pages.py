"""The statement pages and the bank regions on the Payouts page, through the app in
process as a browser sends them (signed in by the form, cookie and CSRF): each page
shows the signed-in account's month, says a bad month beside its field, offers the CSV,
and hides its menu, forms and buttons when printed."""

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.web import STATIC_DIR
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from tests.coordinator.services.money.test_bank_regions import TURKISH
from tests.coordinator.services.money.test_statements import november  # noqa: F401 (a fixture)


@asynccontextmanager
async def signed_in(app: FastAPI, key: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        form = await http.get("/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = await http.post("/signin", data={"csrf": csrf.group(1), "key": key})
        assert answer.status_code == 303, answer.text
        yield http


@pytest.mark.usefixtures("november")
async def test_the_tenant_reads_a_month_on_its_statement_page_linked_from_usage(
    app: FastAPI, tenant: TenantHandle
) -> None:
    async with signed_in(app, tenant.key) as http:
        usage = await http.get("/console/usage")
        assert 'href="/console/usage/statement"' in usage.text
        page = await http.get("/console/usage/statement", params={"month": "2026-11"})
        assert page.status_code == 200
        assert "Statement for November 2026" in page.text
        assert re.search(r'id="statement-net">10.5<', page.text)
        assert "onnx_cuda" in page.text and "catboost" in page.text
        assert 'href="/console/usage/statement.csv?month=2026-11"' in page.text
        as_csv = await http.get("/console/usage/statement.csv", params={"month": "2026-11"})
        assert as_csv.status_code == 200 and "total,total,3,3.0,11.5,1,10.5" in as_csv.text

        default = await http.get("/console/usage/statement")
        assert "Statement for November 2026" in default.text  # the last complete month
        wrong = await http.get("/console/usage/statement", params={"month": "2027-02"})
        assert wrong.status_code == 422
        assert "2027-02 has not started yet" in wrong.text and 'aria-invalid="true"' in wrong.text


@pytest.mark.usefixtures("november")
async def test_the_provider_reads_a_month_on_its_statement_page_linked_from_earnings(
    app: FastAPI, provider: ProviderHandle
) -> None:
    async with signed_in(app, provider.key) as http:
        earnings = await http.get("/provider/earnings")
        assert 'href="/provider/earnings/statement"' in earnings.text
        page = await http.get("/provider/earnings/statement", params={"month": "2026-11"})
        assert page.status_code == 200
        assert re.search(r'id="statement-net">8.925<', page.text)
        assert "No payouts were made this month." in page.text
        bad = await http.get("/provider/earnings/statement.csv", params={"month": "11/2026"})
        assert bad.status_code == 422


async def test_the_payouts_page_says_where_bank_payouts_go_and_refuses_others(
    app: FastAPI, provider: ProviderHandle
) -> None:
    async with signed_in(app, provider.key) as http:
        page = await http.get("/provider/payouts")
        assert "Bank payouts go only to accounts in SEPA" in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        form = {
            "csrf": csrf.group(1),
            "schedule": "weekly",
            "kind": "bank_transfer",
            "account_holder": TURKISH["account_holder"],
            "iban": TURKISH["iban"],
            "bic": TURKISH["bic"],
        }
        refused = await http.post("/provider/payouts/settings", data=form)
        assert refused.status_code == 422
        assert "this IBAN is in TR" in refused.text and 'id="iban-error"' in refused.text
        assert "No payout method yet" in refused.text  # nothing was saved


def test_printing_leaves_out_the_menu_forms_and_buttons() -> None:
    css = (Path(STATIC_DIR) / "app.css").read_text()
    printed = css[css.index("@media print") :]
    for hidden in (".topbar", ".no-print", "form", "button", ".button"):
        assert hidden in printed.split("{", 2)[1]
