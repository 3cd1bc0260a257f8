"""Money on the wire (protocol/money.py): every amount a request carries, in every model
that takes one, is read by one parser that takes exactly what the published pattern
allows; the pattern the OpenAPI document shows is that parser's."""

import re
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpu_share.protocol.billing import TopUpCreate
from gpu_share.protocol.invokes import InvokeCreate
from gpu_share.protocol.money import USDC_PATTERN, to_micro
from gpu_share.protocol.offers import OfferQuery
from gpu_share.protocol.payouts import ManualPayout
from gpu_share.protocol.prices import PriceUpdate
from gpu_share.protocol.reservations import ReservationRequest
from gpu_share.protocol.sessions import SessionCreate

JOB = {"runtime": "onnx_cpu", "model_url": "https://example.com/m.onnx"}

# (model, the fields it needs besides the amount, the amount's field)
MONEY_FIELDS: list[tuple[type[BaseModel], dict[str, Any], str]] = [
    (TopUpCreate, {"reference": "wire-1"}, "amount"),
    (PriceUpdate, {"spot_discount_pct": 40}, "price_per_gpu_hour"),
    (ManualPayout, {}, "amount"),
    (InvokeCreate, JOB, "max_cost"),
    (InvokeCreate, JOB, "max_price_per_gpu_hour"),
    (SessionCreate, JOB, "max_price_per_gpu_hour"),
    (ReservationRequest, {"hours": 1}, "max_price"),
    (OfferQuery, {}, "max_price"),
]
# Amounts that once passed as money although the published pattern refuses them (or,
# "-5", passed where only more than 0 is allowed); the API and form tests send these.
OFF_PATTERN = ["1e3", "+5", ".5", " 5", "5 ", "-5", "0x10", "1_000", "５", "NaN", "Infinity"]
MALFORMED = [*OFF_PATTERN, "1E3", "5.", "5\n", "٥", "-Infinity", "", "5,0", "1.1234567"]


@pytest.mark.parametrize("amount", MALFORMED)
@pytest.mark.parametrize(
    ("model", "others", "field"),
    MONEY_FIELDS,
    ids=[f"{m.__name__}.{f}" for m, _, f in MONEY_FIELDS],
)
def test_every_money_field_refuses_what_the_published_pattern_refuses(
    model: type[BaseModel], others: dict[str, Any], field: str, amount: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate({**others, field: amount})
    assert [error["loc"] for error in refused.value.errors()] == [(field,)]


@pytest.mark.parametrize(
    ("model", "others", "field"),
    MONEY_FIELDS,
    ids=[f"{m.__name__}.{f}" for m, _, f in MONEY_FIELDS],
)
def test_every_money_field_takes_a_decimal_string_to_the_micro_usdc(
    model: type[BaseModel], others: dict[str, Any], field: str
) -> None:
    held = getattr(model.model_validate({**others, field: "2.000005"}), field)
    assert held in (2_000_005, Decimal("2.000005"))


@pytest.mark.parametrize(
    ("text", "micro"),
    [("0", 0), ("25", 25_000_000), ("2.5", 2_500_000), ("0.000001", 1), ("-0.5", -500_000)],
)
def test_text_the_pattern_allows_is_read_exactly(text: str, micro: int) -> None:
    assert to_micro(text) == micro


def test_sdk_callers_may_pass_an_int_or_a_decimal_but_never_a_float() -> None:
    assert to_micro(5) == 5_000_000 and to_micro(Decimal("2.50")) == 2_500_000
    assert to_micro(Decimal("1E+3")) == 1_000_000_000
    for value in (2.5, True, None, Decimal("NaN"), Decimal("0.0000001")):
        with pytest.raises(ValueError, match="USDC"):
            to_micro(value)


def test_the_parser_agrees_with_the_pattern_as_json_schema_reads_it() -> None:
    published = TopUpCreate.model_json_schema()["properties"]["amount"]["pattern"]
    assert published == USDC_PATTERN
    ecma = re.compile(published.replace(r"\d", "[0-9]"))  # JSON Schema's \d is ASCII
    for text in [*MALFORMED, "0", "7", "12.5", "-0.000001", "999999999", "00.10"]:
        takes = True
        try:
            to_micro(text)
        except ValueError:
            takes = False
        assert takes == bool(ecma.search(text) and "\n" not in text), text


def test_a_price_limit_may_be_a_json_number_but_not_a_negative_or_an_endless_one() -> None:
    assert OfferQuery.model_validate({"max_price": 2.5}).max_price == Decimal("2.5")
    assert OfferQuery.model_validate({"max_price": 0}).max_price == Decimal(0)
    for number in (-1, 1e-7, 1e308, float("inf"), float("nan"), 1_000_000):
        with pytest.raises(ValidationError):
            OfferQuery.model_validate({"max_price": number})
    dumped = InvokeCreate.model_validate({**JOB, "max_price_per_gpu_hour": Decimal("1E+3")})
    assert dumped.model_dump(mode="json")["max_price_per_gpu_hour"] == "1000"
