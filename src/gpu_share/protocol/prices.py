"""A provider's prices and the market's recommendation for them (SPEC §3.4).

Prices are per GPU model as the agent reports it (NVML's name, such as "NVIDIA H100
80GB HBM3"), or "cpu" for a CPU node, in USDC per GPU-hour; the spot rate is that
price less the provider's spot discount, rounded down to the micro-USDC. Amounts go
out as decimal strings (`usdc_text`), never floats. docs/pricing.md has the details.
"""

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from gpu_share.protocol.money import MICRO, PositiveUsdc, usdc_text

MAX_PRICE_MICRO = 1_000 * MICRO  # per GPU-hour: far above any real GPU's market rate
MIN_SPOT_DISCOUNT_PCT = 30
MAX_SPOT_DISCOUNT_PCT = 70


def _at_most_max_price(micro: int) -> int:
    if micro > MAX_PRICE_MICRO:
        raise ValueError(
            f"at most {usdc_text(MAX_PRICE_MICRO)} USDC per GPU-hour; "
            "give the price of one GPU for one hour"
        )
    return micro


PricePerGpuHour = Annotated[PositiveUsdc, AfterValidator(_at_most_max_price)]


class PriceUpdate(BaseModel):
    """Set the price of one GPU model (the model is named in the URL)."""

    price_per_gpu_hour: PricePerGpuHour = Field(
        description='USDC per GPU per hour, as a decimal string such as "2.5" '
        f"(more than 0, at most {usdc_text(MAX_PRICE_MICRO)}, six decimals at most)"
    )
    spot_discount_pct: int = Field(
        ge=MIN_SPOT_DISCOUNT_PCT,
        le=MAX_SPOT_DISCOUNT_PCT,
        description="The discount spot work gets, in percent (30 to 70); spot work is "
        "preemptible by on-demand work",
    )


class Price(BaseModel):
    gpu_model: str = Field(description='As the agent reports it; "cpu" for CPU nodes')
    price_per_gpu_hour: str = Field(description="USDC per GPU-hour, on demand")
    spot_discount_pct: int
    spot_price_per_gpu_hour: str = Field(
        description="USDC per GPU-hour for spot work: the price less the discount, "
        "rounded down to the micro-USDC"
    )
    machines: int = Field(description="Your machines that run this model now")
    updated_at: datetime


class ProviderPrices(BaseModel):
    """A change applies to work placed after it; running work keeps its rate."""

    prices: list[Price]
    unpriced_models: list[str] = Field(
        description="Models your machines run without a price: they are listed with none "
        "(shown as free of charge) until you set one"
    )


class ComparedIn(StrEnum):
    REGION = "region"  # offers in the same region only
    ALL_REGIONS = "all_regions"  # too few in the region (or it has none): every region


class Recommendation(BaseModel):
    """What comparable offers of other providers charge, weighted by how much they are
    used; no figures at all when there are none (docs/pricing.md)."""

    gpu_model: str
    region: str | None = Field(description="The region of your machines it is for")
    compared_in: ComparedIn
    comparable_offers: int = Field(description="Other providers' priced, listed machines")
    comparable_gpus: int
    market_utilization: float | None = Field(
        description="Share of the comparable GPUs' time in use over the window, 0 to 1"
    )
    suggested_price_per_gpu_hour: str | None = Field(
        description="The weighted median of the comparable prices, USDC"
    )
    range_low: str | None = Field(description="The weighted 25th percentile, USDC")
    range_high: str | None = Field(description="The weighted 75th percentile, USDC")
    your_price_per_gpu_hour: str | None
    your_percentile: int | None = Field(
        description="Share (0-100) of the comparable supply priced below yours, ties "
        "counted half; null when you have no price or there is nothing to compare"
    )
    window_days: int
    basis: str = Field(description="What the figures rest on, in words")
