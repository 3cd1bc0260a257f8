"""Tenant billing on the wire (SPEC §4.4): balance, usage, quotes and admin top-ups.

Amounts in answers are decimal USDC strings (`money.usdc_text`); amounts in requests
are `money.PositiveUsdc`, given in USDC and held as micro-USDC.
"""

from datetime import date, datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from gpu_share.protocol.money import MICRO, PositiveUsdc, usdc_text

MAX_TOP_UP_MICRO = 1_000_000 * MICRO  # one top-up: a million USDC is a typo or an attack


class BillingMode(StrEnum):
    PREPAID = "prepaid"  # tenants spend a balance admins top up; 402 when it cannot cover
    FREE = "free"  # nothing is charged (the embedded `gpu-share up`, unless configured)


class Balance(BaseModel):
    tenant_id: str
    billing: BillingMode
    available: str = Field(description="USDC the tenant can spend on new work")
    reserved: str = Field(description="USDC held for running work's most it can cost")


class UsageGroup(StrEnum):
    DAY = "day"  # UTC days
    RUNTIME = "runtime"


class UsageLine(BaseModel):
    key: str = Field(description="The UTC day (YYYY-MM-DD) or the runtime")
    charges: int = Field(description="Charges made, refunded ones included")
    seconds: float = Field(description="Metered seconds")
    cost: str = Field(description="USDC spent: what these charges took less what was refunded")
    refunded: str = Field(
        default="0", description="USDC of these charges given back by refunds, whenever made"
    )


class Usage(BaseModel):
    tenant_id: str
    group: UsageGroup
    start: date = Field(description="First UTC day counted")
    end: date = Field(description="Last UTC day counted")
    lines: list[UsageLine]
    total: str = Field(description="USDC spent in the period, net of refunds")
    refunded: str = Field(
        default="0", description="USDC of the period's charges given back by refunds"
    )


def _sane_top_up(micro: int) -> int:
    if micro > MAX_TOP_UP_MICRO:
        raise ValueError(f"a top-up may be at most {usdc_text(MAX_TOP_UP_MICRO)} USDC")
    return micro


class TopUpCreate(BaseModel):
    model_config = {"extra": "forbid"}

    amount: Annotated[PositiveUsdc, AfterValidator(_sane_top_up)] = Field(
        description='USDC, as a decimal string such as "25" or "2.5"'
    )
    reference: str = Field(
        min_length=1,
        max_length=120,
        pattern=r"^[\x21-\x7e][\x20-\x7e]*$",
        description="The payment's reference (invoice, transfer id); a top-up is made once "
        "per reference, so a retry never credits twice",
    )


class TopUp(BaseModel):
    tenant_id: str
    amount: str
    reference: str
    replayed: bool = Field(description="True when this top-up had been made before")
    available: str = Field(description="The tenant's balance after it")


class Quote(BaseModel):
    """What an invoke would cost if submitted now (`POST /v1/gpu/quote`)."""

    billing: BillingMode
    node_id: str = Field(description="The node placement would pick now")
    gpu_model: str
    units: int = Field(description="GPUs billed (1 for CPU work)")
    rate_per_gpu_hour: str
    rate_per_hour: str = Field(description="For all billed GPUs")
    max_cost: str = Field(description="timeout_sec at this rate, capped by the request's max_cost")
    reserve: str = Field(
        description="What submitting it would hold from the balance until it ends: max_cost, "
        "or more for spot work (held at on-demand rates) and when dearer nodes match"
    )
    expected_cost: str
    expected_seconds: float
    expected_basis: str = Field(
        description='"history": the median metered time of this tenant\'s recent invokes of '
        'the same model; "timeout": no history, the whole timeout'
    )
    available: str = Field(description="The tenant's balance now")
    covered: bool = Field(description="Whether the balance covers the reserve")
    within_cap: bool = Field(
        default=True,
        description="Whether the reserve fits under your monthly spending cap (true without one)",
    )


class Charge(BaseModel):
    """One CHARGE of the tenant's usage (a row of the CSV export)."""

    at: datetime
    work: str
    work_id: str
    runtime: str
    node_id: str
    gpu_model: str
    gpus: int
    spot: bool
    seconds: float
    rate_per_hour: str
    cost: str = Field(description="USDC the charge took")
    refunded: str = Field(
        default="0", description="USDC given back by a refund of this charge (all it took), or 0"
    )
    refunded_at: datetime | None = Field(default=None, description="When it was refunded")
    refund_reason: str | None = Field(
        default=None, description="Why, e.g. its node was caught returning wrong results"
    )
