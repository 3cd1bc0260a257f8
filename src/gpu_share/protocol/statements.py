"""Monthly statements (SPEC §3.6, §4.4): a tenant's spend and a provider's earnings and
payouts over one UTC calendar month, read from the books. Amounts are decimal USDC."""

from datetime import date, datetime

from pydantic import BaseModel, Field


class SpendLine(BaseModel):
    key: str = Field(description="The runtime, or the GPU model (cpu for CPU nodes)")
    charges: int
    gpu_hours: float
    cost: str = Field(description="What the charges cost, refunded ones included")
    refunded: str = Field(description="What refunds gave back of them")
    net: str = Field(description="cost - refunded: what the month took for good")


class TenantStatement(BaseModel):
    tenant_id: str
    month: str = Field(description="YYYY-MM, UTC")
    start: date
    end: date = Field(description="The month's last day, or today for the current month")
    complete: bool = Field(description="False for the current month: it is not over yet")
    by_runtime: list[SpendLine]
    by_gpu_model: list[SpendLine]
    total: SpendLine


class EarningsLine(BaseModel):
    key: str = Field(description="The GPU model (cpu for CPU nodes)")
    charges: int
    gpu_hours: float
    gross: str = Field(description="What tenants paid, refunded charges left out")
    commission: str = Field(description="The platform's share of gross")
    net: str = Field(description="gross - commission: your earnings")
    refunded: str = Field(description="Your share of charges refunded to their tenant")


class StatementPayout(BaseModel):
    id: str
    created_at: datetime
    period: str
    method: str = Field(description="solana_usdc or bank_transfer")
    amount: str
    status: str
    reference: str | None = Field(
        description="The transaction signature or bank reference once paid; for a bank "
        "payout in a bank file, its end-to-end id until then"
    )
    settled_at: datetime | None


class ProviderStatement(BaseModel):
    provider_id: str
    month: str
    start: date
    end: date
    complete: bool
    by_gpu_model: list[EarningsLine]
    total: EarningsLine
    payouts: list[StatementPayout] = Field(description="Made in the month, oldest first")
    payouts_total: str
    paid_total: str = Field(description="Of those, what is marked paid")
