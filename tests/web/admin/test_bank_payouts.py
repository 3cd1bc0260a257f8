"""The admin's bank payouts on the pages, in process as a browser sends them: the batch
page makes the SEPA file at a rate, the payouts page reads the bank's statement, and a
refused export is a page saying why, with nothing changed."""

import re

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import SepaExportRow
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TEST_ADMIN_KEY, ProviderHandle
from tests.coordinator.services.money.test_payouts import count, in_transit
from tests.coordinator.services.money.test_sepa_export import (
    bank_batch,
    camt_053,
    entry,
    payout_of,
    settings,  # noqa: F401 (the platform's bank account, a fixture)
)
from tests.web.test_statement_pages import signed_in


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


async def test_the_admin_downloads_the_bank_file_and_settles_it_from_the_statement(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    batch_id, _who, _owed = await bank_batch(app, client, provider, clock)
    async with signed_in(app, TEST_ADMIN_KEY) as http:
        page = await http.get(f"/admin/payouts/{batch_id}")
        assert 'action="/admin/payouts/' in page.text and "Bank file (SEPA)" in page.text
        token = csrf_of(page)
        refused = await http.post(
            f"/admin/payouts/{batch_id}/sepa", data={"csrf": token, "eur_per_usdc": "abc"}
        )
        assert refused.status_code == 422 and "decimal text" in refused.text
        assert await count(app, SepaExportRow) == 0

        made = await http.post(
            f"/admin/payouts/{batch_id}/sepa", data={"csrf": token, "eur_per_usdc": "1"}
        )
        assert made.status_code == 200, made.text
        assert made.headers["content-type"].startswith("application/xml")
        assert "<EndToEndId>" in made.text

        e2e = (await payout_of(app, provider.id)).id.replace("_", "-")
        listing = await http.get("/admin/payouts")
        assert 'enctype="multipart/form-data"' in listing.text
        read = await http.post(
            "/admin/bank-statements",
            data={"csrf": csrf_of(listing)},
            files={"statement": ("camt.xml", camt_053([entry(e2e)]), "application/xml")},
        )
        assert read.status_code == 303
        assert (await payout_of(app, provider.id)).status == "paid"
        assert await in_transit(app, provider.id) == 0
