"""Bank payout regions (docs/payouts.md, "Bank payouts"): the operator enables SEPA (the
default) or some of its countries; a provider saving a bank account elsewhere is told
which regions are paid, before anything is saved, in the API and on the Payouts page."""

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.bank_regions import SEPA_COUNTRIES, region_countries
from gpu_share.testing.factories import ProviderHandle
from tests.coordinator.services.money.test_payouts import BANK, SOLANA, auth, replica_of, set_method

TURKISH = {**BANK, "iban": "TR33 0006 1005 1978 6457 8413 26", "bic": "TCZBTR2A"}
FRENCH = {**BANK, "iban": "FR1420041010050500013M02606", "bic": "BNPAFRPPXXX"}


def test_regions_are_read_from_a_comma_separated_variable_and_checked() -> None:
    assert Settings().bank_payout_regions == ["SEPA"]
    assert Settings(bank_payout_regions="sepa, de").bank_payout_regions == ["SEPA", "DE"]
    assert Settings(bank_payout_regions="").bank_payout_regions == []
    with pytest.raises(ValidationError, match="'US' is not a bank payout region"):
        Settings(bank_payout_regions="DE,US")
    assert region_countries(["SEPA"]) == SEPA_COUNTRIES
    assert {"DE", "FR", "CH", "GB", "NO"} <= SEPA_COUNTRIES and "TR" not in SEPA_COUNTRIES


def test_the_platforms_own_account_is_checked_at_start() -> None:
    with pytest.raises(ValidationError, match="not a valid IBAN"):
        Settings(sepa_debtor_iban="DE89370400440532013001")
    assert Settings(sepa_debtor_iban="gb33 bukb 2020 1555 5555 55").sepa_debtor_iban == (
        "GB33BUKB20201555555555"
    )


async def test_an_account_outside_sepa_is_refused_naming_the_regions_and_nothing_changes(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    assert (await set_method(client, provider, SOLANA, "weekly")).status_code == 200
    refused = await set_method(client, provider, TURKISH, "monthly")
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert "this IBAN is in TR" in error["message"] and "SEPA" in error["message"]
    assert error["details"][0]["loc"] == ["method", "iban"]
    kept = (await client.get("/v1/provider/payout-settings", headers=auth(provider))).json()
    assert kept["method"] == SOLANA and kept["schedule"] == "weekly"


@pytest.mark.parametrize(
    ("regions", "method", "accepted"),
    [
        (["DE"], BANK, True),
        (["DE"], FRENCH, False),
        ([], BANK, False),
        ([], SOLANA, True),
    ],
)
async def test_the_operators_regions_decide_which_accounts_are_accepted(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    regions: list[str],
    method: dict[str, Any],
    accepted: bool,
) -> None:
    replica_of(app).settings.bank_payout_regions = regions
    answer = await set_method(client, provider, method, "weekly")
    assert (answer.status_code == 200) is accepted, answer.text
