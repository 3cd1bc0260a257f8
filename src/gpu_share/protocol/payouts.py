"""Provider earnings and payouts on the wire (SPEC §3.6).

A payout method is one of two kinds, told apart by `kind`:

- `solana_usdc`: USDC on Solana, to `address`, a base58 public key that decodes to
  exactly 32 bytes;
- `bank_transfer`: to `iban` (country format and checksum checked) at `bic` (format
  and country checked), in the name of `account_holder`.

IBAN and BIC are stored and shown in their compact upper-case form. Amounts in
answers are decimal strings of USDC (`usdc_text`), never floats.
"""

import re
from datetime import date, datetime
from enum import StrEnum
from typing import Annotated, Literal

import base58
from pydantic import BaseModel, Field, field_validator
from schwifty import BIC, IBAN
from schwifty.exceptions import SchwiftyException

from gpu_share.protocol.money import PositiveUsdc

SOLANA_KEY_BYTES = 32
_BASE58 = re.compile(r"^[1-9A-HJ-NP-Za-km-z]+$")  # Bitcoin alphabet: no 0, O, I or l


class PayoutSchedule(StrEnum):
    WEEKLY = "weekly"  # Mondays (UTC), when the pending balance reaches the minimum
    MONTHLY = "monthly"  # the first business day (Monday to Friday) of the month, UTC


class PayoutStatus(StrEnum):
    IN_TRANSIT = "in_transit"  # taken from the pending balance, being executed
    PAID = "paid"  # executed; `reference` names the transaction
    FAILED = "failed"  # not executed; the amount is back in the pending balance


class ChainState(StrEnum):
    """Where a payout the platform sends on Solana stands."""

    AWAITING_APPROVAL = "awaiting_approval"  # above an operator's limit: an admin approves it
    SENDING = "sending"  # signed, sent and followed to finalized
    FINALIZED = "finalized"  # landed and finalized: the payout is paid
    FAILED = "failed"  # failed on chain or refused, or settled by hand before it was sent


def solana_address(value: str) -> str:
    """The address as given, once it is base58 of exactly 32 bytes; ValueError saying why not."""
    address = value.strip()
    if not address:
        raise ValueError("enter your Solana wallet address")
    bad = sorted({c for c in address if not _BASE58.fullmatch(c)})
    if bad:
        shown = " ".join(repr(c) for c in bad[:5])
        raise ValueError(
            f"a Solana address is base58 and cannot contain {shown} "
            "(base58 has no 0, O, I or l, spaces or punctuation)"
        )
    decoded = base58.b58decode(address)
    if len(decoded) != SOLANA_KEY_BYTES:
        raise ValueError(
            f"a Solana address is 32 bytes in base58 (32 to 44 characters); this one is "
            f"{len(decoded)} bytes: check that you copied all of it"
        )
    return address


def iban_text(value: str) -> str:
    try:
        return str(IBAN(value.strip()).compact)
    except SchwiftyException as exc:
        raise ValueError(f"not a valid IBAN ({_why(exc)}): copy it from your bank") from None


def bic_text(value: str) -> str:
    try:
        return str(BIC(value.strip()).compact)
    except SchwiftyException as exc:
        raise ValueError(
            f"not a valid BIC ({_why(exc)}): 8 or 11 letters and digits, such as DEUTDEFF"
        ) from None


def _why(exc: SchwiftyException) -> str:
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    return text[:1].lower() + text[1:]


class SolanaUsdc(BaseModel):
    kind: Literal["solana_usdc"] = "solana_usdc"
    address: str = Field(max_length=64, description="Your Solana wallet address (base58)")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return solana_address(value)


class BankTransfer(BaseModel):
    kind: Literal["bank_transfer"] = "bank_transfer"
    account_holder: str = Field(min_length=1, max_length=140, description="The name on the account")
    iban: str = Field(max_length=64, description="Checked for its country's format and checksum")
    bic: str = Field(max_length=16, description="The bank's BIC (SWIFT code), 8 or 11 characters")

    @field_validator("account_holder")
    @classmethod
    def _holder(cls, value: str) -> str:
        name = " ".join(value.split())
        if not name:
            raise ValueError("enter the name on the bank account")
        return name

    @field_validator("iban")
    @classmethod
    def _iban(cls, value: str) -> str:
        return iban_text(value)

    @field_validator("bic")
    @classmethod
    def _bic(cls, value: str) -> str:
        return bic_text(value)


PayoutMethod = Annotated[SolanaUsdc | BankTransfer, Field(discriminator="kind")]


class PayoutSettingsUpdate(BaseModel):
    method: PayoutMethod
    schedule: PayoutSchedule = PayoutSchedule.WEEKLY


class PayoutSettings(BaseModel):
    method: PayoutMethod | None = Field(description="None until you set one: nothing is paid out")
    schedule: PayoutSchedule
    minimum: str = Field(description="USDC: a weekly payout waits until pending reaches this")
    next_payout_on: date = Field(description="The next day (UTC) a payout can be made")


class Payout(BaseModel):
    id: str
    batch_id: str | None
    period: str = Field(description='"2026-W49" (weekly), "2026-12" (monthly) or "manual"')
    amount: str = Field(description="USDC")
    method: PayoutMethod
    status: PayoutStatus
    created_at: datetime
    settled_at: datetime | None
    reference: str | None = Field(description="The transaction that paid it, once paid")
    failure_reason: str | None
    chain_state: ChainState | None = Field(
        default=None, description="Where it stands when the platform sends it on Solana"
    )
    signature: str | None = Field(
        default=None, description="Its Solana transaction (the latest sent, until finalized)"
    )
    explorer_url: str | None = Field(default=None, description="That transaction in an explorer")


class ChainPayout(BaseModel):
    """A payout the platform sends on Solana, as the admin follows it."""

    payout_id: str
    provider_id: str
    provider_name: str
    amount: str = Field(description="USDC")
    destination: str = Field(description="The provider's wallet")
    state: ChainState
    created_at: datetime
    signature: str | None
    explorer_url: str | None
    rejected: str | None = Field(description="Why the RPC refused the last send, if it did")


class BatchPayout(Payout):
    provider_id: str
    provider_name: str
    provider_email: str


class PayoutBatch(BaseModel):
    id: str
    period: str
    schedule: PayoutSchedule
    created_at: datetime
    exported_at: datetime | None
    payouts: int
    total: str = Field(description="USDC")
    in_transit: int = Field(description="Payouts not yet marked paid or failed")


class PayoutBatchDetail(PayoutBatch):
    items: list[BatchPayout]


class ManualPayout(BaseModel):
    """An admin's payout outside the schedule; at most the provider's pending balance."""

    amount: PositiveUsdc


class MarkPaid(BaseModel):
    reference: str = Field(
        min_length=1, max_length=200, description="The transaction signature or bank reference"
    )

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("enter the transaction's reference")
        return value.strip()


class MarkFailed(BaseModel):
    reason: str = Field(min_length=1, max_length=1000, description="Told to the provider")

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("say why the payout failed; the provider reads it")
        return value.strip()


# ---- earnings ---------------------------------------------------------------------------


class EarningsTotal(BaseModel):
    amount: str = Field(description="USDC earned (after the platform's commission)")
    gpu_hours: float
    charges: int


class GpuEarnings(EarningsTotal):
    node_id: str
    hostname: str | None
    label: str | None = Field(default=None, description="Your name for the machine")
    gpu_model: str


class ModelEarnings(EarningsTotal):
    gpu_model: str


class DayEarnings(BaseModel):
    day: date
    amount: str


class EarningsEntry(BaseModel):
    """One charge, as the provider sees it (which tenant paid is not shown)."""

    at: datetime
    node_id: str
    hostname: str | None
    label: str | None = Field(default=None, description="Your name for the machine")
    gpu_model: str
    gpus: int
    seconds: float
    work: str
    runtime: str
    amount: str = Field(description="USDC earned")
    tenant_paid: str = Field(description="USDC the tenant paid")
    commission: str = Field(description="USDC kept by the platform")
    payable_at: datetime | None = Field(
        default=None,
        description="While the charge's earnings are held: when they become payable; "
        "null once they are (or once refunded)",
    )


class HeldRelease(BaseModel):
    """Held earnings that become payable on one day."""

    on: date = Field(description="The UTC day they become payable (today: any moment now)")
    amount: str


class Earnings(BaseModel):
    pending: str = Field(description="USDC earned and not yet in a payout: `held` + `payable`")
    held: str = Field(
        default="0",
        description="USDC earned and still in the hold: refunded to the tenant if the work "
        "proves a cheat's, payable once the hold passes",
    )
    payable: str = Field(default="0", description="USDC past the hold: what payouts pay")
    releases: list[HeldRelease] = Field(
        default_factory=list, description="`held` by the day it becomes payable, soonest first"
    )
    refunded: str = Field(
        default="0", description="USDC of held earnings refunded to tenants, all time"
    )
    forfeited: str = Field(
        default="0", description="USDC of held earnings forfeited for cheating, all time"
    )
    in_transit: str = Field(description="USDC in payouts not yet marked paid")
    paid: str = Field(description="USDC paid out, all time")
    this_week: EarningsTotal = Field(description="Since Monday 00:00 UTC")
    this_month: EarningsTotal = Field(description="Since the 1st, 00:00 UTC")
    since: date
    until: date = Field(description="Inclusive; the range the lists below cover")
    total: EarningsTotal = Field(description="Over since…until")
    per_gpu: list[GpuEarnings]
    per_model: list[ModelEarnings]
    daily: list[DayEarnings] = Field(description="Every day of the range, oldest first")
    history: list[EarningsEntry] = Field(description="Newest first, at most `history_limit`")
    history_limit: int
