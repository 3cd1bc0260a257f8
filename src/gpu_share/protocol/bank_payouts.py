"""Bank payouts as SEPA credit-transfer files (SPEC §4.5): what an admin sends to make
a batch's pain.001 file, and what a bank statement import found."""

import re
from datetime import date
from decimal import Decimal

from pydantic import BaseModel, Field, field_validator

RATE = re.compile(r"^\d{1,6}(\.\d{1,8})?$")


class SepaExportCreate(BaseModel):
    eur_per_usdc: str = Field(
        description='The rate the batch is paid at, EUR for one USDC, such as "0.9213"; '
        "recorded on the batch"
    )
    execution_date: date | None = Field(
        default=None, description="The day to ask the bank to pay on; default today (UTC)"
    )

    @field_validator("eur_per_usdc", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        text = str(value).strip() if isinstance(value, str | int) else value
        if not isinstance(text, str) or not RATE.match(text) or Decimal(text) <= 0:
            raise ValueError(
                'a rate above 0 as decimal text with at most 8 decimals, such as "0.9213"'
            )
        return text


class BankStatementResult(BaseModel):
    booked: list[str] = Field(description="Payouts marked paid")
    returned: list[str] = Field(description="Payouts marked failed: the bank returned them")
    already_settled: list[str] = Field(description="Payouts settled before: unchanged")
    unknown: list[str] = Field(description="End-to-end ids in the file that are not ours")
