"""USDC top-ups and monthly statements (docs/billing.md) as flows.

A deposit request moves no money: it names where to send USDC and a reference key,
and a transfer naming that key is credited once when it is finalized. Sending the
request again after a lost answer only makes a second, unused reference, so it is
retried like a read.
"""

from datetime import date
from decimal import Decimal

from gpu_share.protocol.deposits import Deposit, DepositCreate
from gpu_share.protocol.statements import TenantStatement
from gpu_share.sdk._api import _id, validated
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import ApiRequest, Flow, parse, parse_list, send

DEPOSITS = "/v1/billing/deposits"
STATEMENTS = "/v1/billing/statements"


def request_deposit(c: ClientConfig, amount: Decimal | str | int | None = None) -> Flow[Deposit]:
    body = validated(DepositCreate, {"amount": amount}).model_dump(mode="json", exclude_none=True)
    response = yield from send(ApiRequest("POST", DEPOSITS, json=body), c)
    return parse(response, Deposit)


def list_deposits(c: ClientConfig) -> Flow[list[Deposit]]:
    response = yield from send(ApiRequest("GET", DEPOSITS), c)
    return parse_list(response, Deposit)


def month_of(month: date | str) -> str:
    """YYYY-MM from a date (its month) or as given; the server checks the text."""
    return f"{month:%Y-%m}" if isinstance(month, date) else _id(month)


def statement(c: ClientConfig, month: date | str) -> Flow[TenantStatement]:
    response = yield from send(ApiRequest("GET", f"{STATEMENTS}/{month_of(month)}"), c)
    return parse(response, TenantStatement)


def statement_csv(c: ClientConfig, month: date | str) -> Flow[str]:
    response = yield from send(ApiRequest("GET", f"{STATEMENTS}/{month_of(month)}.csv"), c)
    return response.text
