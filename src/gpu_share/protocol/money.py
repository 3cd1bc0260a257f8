"""Money on the wire: integer micro-USDC inside, decimal USDC strings outside (SPEC §3.6).

No float ever holds money. A request names an amount as a decimal string ("2.5") or an
integer of USDC; it is checked to have at most six decimal places and to lie within
bounds, then held as an `int` of micro-USDC (the `Usdc` types below: validated from
USDC, so never build one from a micro amount). Responses carry amounts as decimal
strings made by `usdc_text`, without trailing zeros.
"""

from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

MICRO = 1_000_000  # micro-USDC in one USDC
MAX_MICRO = 10**15  # a billion USDC: more than any single amount this platform handles


def usdc_text(micro: int) -> str:
    """2_500_000 → "2.5"; -1 → "-0.000001"."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    return f"{sign}{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else f"{sign}{whole}"


def to_micro(value: object) -> int:
    """A decimal amount of USDC as micro-USDC; ValueError saying what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise ValueError('give the amount in USDC as a decimal string, such as "2.5"')
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a number of USDC") from None
    if not amount.is_finite():
        raise ValueError("the amount must be a finite number of USDC")
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError("USDC has six decimal places: the amount has more")
    if abs(micro) > MAX_MICRO:
        raise ValueError(f"the amount is larger than {usdc_text(MAX_MICRO)} USDC")
    return int(micro)


def _positive(value: object) -> int:
    micro = to_micro(value)
    if micro <= 0:
        raise ValueError("the amount must be more than 0 USDC")
    return micro


_AS_TEXT = PlainSerializer(usdc_text, return_type=str, when_used="json")
_SCHEMA = WithJsonSchema(
    {"type": "string", "pattern": r"^-?\d+(\.\d{1,6})?$", "description": "USDC, as a decimal"}
)

# A request's amount: given in USDC, held in micro-USDC, written back as USDC.
Usdc = Annotated[int, BeforeValidator(to_micro), _AS_TEXT, _SCHEMA]
# The same, more than zero: a price, a top-up, a cap.
PositiveUsdc = Annotated[int, BeforeValidator(_positive), _AS_TEXT, _SCHEMA]
