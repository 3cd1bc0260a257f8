"""Money on the wire: integer micro-USDC inside, decimal USDC strings outside (SPEC §3.6).

No float ever holds money. A request names an amount as text that matches
`USDC_PATTERN` exactly ("2.5", "25", "-0.000001": ASCII digits, an optional sign, at most
six decimals; no exponent, no "+", no spaces, no "." at either end), which is the pattern
the OpenAPI document publishes, or as an integer of USDC. `to_micro` is the one parser:
the `Usdc` types below and every form that takes money go through it, so the API and the
pages refuse the same things with the same words. Amounts are held as an `int` of
micro-USDC (validated from USDC, so never build one from a micro amount); responses
carry them as decimal strings made by `usdc_text`, without trailing zeros.
"""

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

MICRO = 1_000_000  # micro-USDC in one USDC
MAX_MICRO = 10**15  # a billion USDC: more than any single amount this platform handles
MAX_CAP_MICRO = 10**12 - 1  # 999999.999999: a price limit has 12 digits, 6 of them decimals

USDC_PATTERN = r"^-?\d+(\.\d{1,6})?$"  # published in the OpenAPI document, as it is
# The same pattern, read as JSON Schema reads it: `\d` is an ASCII digit and the match is
# the whole text (fullmatch: "5\n" does not pass as "5").
_USDC_TEXT = re.compile(USDC_PATTERN, re.ASCII)
_TOO_FINE = re.compile(r"-?[0-9]+\.[0-9]{7,}", re.ASCII)
_STEP = Decimal(1).scaleb(-6)  # one micro-USDC


def usdc_text(micro: int) -> str:
    """2_500_000 → "2.5"; -1 → "-0.000001"."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else f"{sign}{whole}"


def to_micro(value: object) -> int:
    """An amount of USDC as micro-USDC; ValueError saying what is wrong with it.

    Text must match `USDC_PATTERN`; an int or a Decimal (what SDK callers pass) is taken
    as the number it is. Floats are refused: they cannot hold most decimal amounts."""
    if isinstance(value, str):
        amount = _from_text(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        amount = Decimal(value)
    elif isinstance(value, Decimal):
        amount = value
    else:
        raise ValueError('give the amount in USDC as a decimal string, such as "2.5"')
    if not amount.is_finite():
        raise ValueError("the amount must be a finite number of USDC")
    if abs(amount) > MAX_MICRO // MICRO:
        raise ValueError(f"the amount is larger than {usdc_text(MAX_MICRO)} USDC")
    if amount.quantize(_STEP) != amount:
        raise ValueError("USDC has six decimal places: the amount has more")
    return int(amount.scaleb(6))


def _from_text(text: str) -> Decimal:
    if not text:
        raise ValueError('give the amount in USDC, such as "2.5"')
    if _USDC_TEXT.fullmatch(text):
        return Decimal(text)
    if _TOO_FINE.fullmatch(text):
        raise ValueError("USDC has six decimal places: the amount has more")
    shown = repr(text if len(text) <= 40 else text[:40] + "…")
    raise ValueError(
        f'{shown} is not a number of USDC: write digits with an optional "." and at most '
        'six decimals, such as "2.5" (no exponent, sign "+" or spaces)'
    )


def _positive(value: object) -> int:
    micro = to_micro(value)
    if micro <= 0:
        raise ValueError("the amount must be more than 0 USDC")
    return micro


def _price_cap(value: object) -> Decimal:
    """A JSON number is taken by its shortest text (2.5 → "2.5"), then parsed as text is."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("the amount must be a finite number of USDC")
        value = Decimal(repr(value))
    micro = to_micro(value)
    if micro < 0:
        raise ValueError("the amount must not be negative")
    if micro > MAX_CAP_MICRO:
        raise ValueError(f"at most {usdc_text(MAX_CAP_MICRO)} USDC")
    return Decimal(usdc_text(micro))


_AS_TEXT = PlainSerializer(usdc_text, return_type=str, when_used="json")
_TEXT_SCHEMA = {"type": "string", "pattern": USDC_PATTERN}
_SCHEMA = WithJsonSchema({**_TEXT_SCHEMA, "description": "USDC, as a decimal"})
_CAP_SCHEMA = WithJsonSchema(
    {
        "anyOf": [{"type": "number", "minimum": 0}, _TEXT_SCHEMA],
        "description": "USDC, 0 or more: a decimal string, or a JSON number",
    }
)

# A request's amount: given in USDC, held in micro-USDC, written back as USDC.
Usdc = Annotated[int, BeforeValidator(to_micro), _AS_TEXT, _SCHEMA]
# The same, more than zero: a price, a top-up, a cap.
PositiveUsdc = Annotated[int, BeforeValidator(_positive), _AS_TEXT, _SCHEMA]
# A most-per-GPU-hour filter (`max_price_per_gpu_hour`, `max_price`): 0 or more, held as
# the Decimal the placement code compares with; a JSON number is also taken.
PriceCap = Annotated[Decimal, BeforeValidator(_price_cap), _CAP_SCHEMA]
