"""A tenant's spending limits on the wire (SPEC §4.5; docs/billing.md): a monthly cap on
new work and a low-balance threshold to be mailed at.

Amounts in requests are `money.PositiveUsdc` (USDC as a decimal string, held as
micro-USDC); `null` removes a limit. Answers carry decimal USDC strings.
"""

from pydantic import BaseModel, ConfigDict, Field

from gpu_share.protocol.billing import BillingMode
from gpu_share.protocol.money import PositiveUsdc


class SpendingLimitsUpdate(BaseModel):
    """`PUT /v1/billing/limits`: both limits as they should be from now on."""

    model_config = ConfigDict(extra="forbid")

    monthly_cap: PositiveUsdc | None = Field(
        default=None,
        description="USDC new work may take in a calendar month (UTC); null: no cap",
    )
    low_balance: PositiveUsdc | None = Field(
        default=None,
        description="USDC: mail me when my available balance falls below this; null: never",
    )


class SpendingLimits(BaseModel):
    tenant_id: str
    billing: BillingMode = Field(description="Limits apply to prepaid billing only")
    monthly_cap: str | None = Field(description="USDC; null: no cap")
    low_balance: str | None = Field(description="USDC; null: no low-balance mail")
    month: str = Field(description="The calendar month (UTC) spent counts, as YYYY-MM")
    spent: str = Field(
        description="USDC this month: charged (net of refunds) plus held for work in flight"
    )
    left: str | None = Field(description="USDC new work may still take this month; null: no cap")
