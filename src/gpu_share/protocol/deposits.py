"""Tenants' USDC top-ups on Solana on the wire (docs/billing.md, "Top up with USDC").

A deposit request answers where to send USDC and a reference key to name in the
transfer (Solana Pay style); each finalized transfer that names it is credited once,
with the amount the platform's account actually received.
"""

from datetime import datetime

from pydantic import BaseModel, Field

from gpu_share.protocol.money import PositiveUsdc


class DepositCreate(BaseModel):
    amount: PositiveUsdc | None = Field(
        default=None, description="USDC you mean to send (a hint for your wallet); optional"
    )


class DepositArrival(BaseModel):
    signature: str = Field(description="The Solana transaction that paid it")
    amount: str = Field(description="USDC credited: what the platform's account received")
    arrived_at: datetime


class Deposit(BaseModel):
    id: str
    address: str = Field(description="The platform's USDC token account that receives it")
    wallet: str = Field(description="Its owner: the recipient in a wallet's send form")
    mint: str = Field(description="The USDC mint: send only this token")
    reference: str = Field(
        description="A public key to add to the transfer as a read-only account (Solana Pay "
        "`reference`): it is how the transfer is known to be yours"
    )
    amount: str | None = Field(description="The amount you said you would send, if you did")
    solana_pay_url: str = Field(description="A solana: link a wallet opens with all of this")
    created_at: datetime
    expires_at: datetime = Field(description="Transfers are looked for until then")
    received: str = Field(description="USDC credited so far")
    arrivals: list[DepositArrival]
