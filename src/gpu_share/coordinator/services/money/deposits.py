"""Tenants' USDC top-ups on Solana: deposit requests and crediting what arrives.

A request is a fresh reference key (a public key nobody holds, Solana Pay style) for
one tenant, watched until it expires. A finalized transfer that names the reference and
raised the platform's USDC account is credited to that tenant once: the ledger's TOP_UP
for the cause ``deposit:<signature>``, world → tenant balance, of the amount the
account actually received, an arrival row keyed by the signature and the
`topup.credited` webhook event, written in the same transaction only when that posting
is new.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote, urlencode

from solders.keypair import Keypair
from solders.pubkey import Pubkey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import DepositArrivalRow, DepositRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.coordinator.services.money.solana.transfers import token_account
from gpu_share.coordinator.services.webhooks import events
from gpu_share.protocol.deposits import Deposit, DepositArrival
from gpu_share.protocol.money import usdc_text

MAX_OPEN = 5  # deposit requests a tenant has watched at once


@dataclass(frozen=True)
class DepositTarget:
    """Where top-ups go: the platform's wallet and the USDC mint."""

    wallet: Pubkey
    mint: Pubkey
    watch_sec: float

    @property
    def account(self) -> Pubkey:
        return token_account(self.wallet, self.mint)


def target_of(settings: Settings) -> DepositTarget | None:
    """None unless both the RPC URL and the deposit wallet are configured."""
    rpc = settings.solana_rpc_url
    if not settings.solana_deposit_wallet or rpc is None or not rpc.get_secret_value():
        return None
    return DepositTarget(
        Pubkey.from_string(settings.solana_deposit_wallet),
        Pubkey.from_string(settings.solana_usdc_mint),
        settings.solana_deposit_ttl_sec,
    )


async def request(
    session: AsyncSession,
    tenant_id: str,
    amount_micro: int | None,
    target: DepositTarget | None,
    now: datetime,
) -> Deposit:
    if target is None:
        raise Conflict(
            "USDC top-ups are not set up on this platform; ask its operator for a top-up"
        )
    await _room_for_one_more(session, tenant_id, now)
    row = DepositRow(
        id=new_id("dep"),
        tenant_id=tenant_id,
        reference=str(Keypair().pubkey()),  # only its public half is ever used
        amount_hint_micro=amount_micro,
        created_at=now,
        expires_at=now + timedelta(seconds=target.watch_sec),
    )
    session.add(row)
    await session.flush()
    return _deposit_of(row, [], target)


async def _room_for_one_more(session: AsyncSession, tenant_id: str, now: datetime) -> None:
    """A tenant keeps at most `MAX_OPEN` requests watched at once: each costs the platform
    an RPC lookup a period until it expires."""
    watched = (
        await session.scalars(
            select(DepositRow.expires_at)
            .where(DepositRow.tenant_id == tenant_id, DepositRow.expires_at > now)
            .order_by(DepositRow.expires_at)
        )
    ).all()
    if len(watched) >= MAX_OPEN:
        raise Conflict(
            f"you have {len(watched)} deposit requests open, the most at once: send to one of "
            "them (each is watched until its expires_at, and any amount is credited), or ask "
            f"again after {watched[0].isoformat()}, when the oldest expires",
            details={"open": len(watched), "next_expiry": watched[0].isoformat()},
        )


async def open_requests(session: AsyncSession, now: datetime) -> list[tuple[str, str]]:
    """(id, reference) of the requests still watched, oldest first."""
    rows = await session.execute(
        select(DepositRow.id, DepositRow.reference)
        .where(DepositRow.expires_at > now)
        .order_by(DepositRow.created_at, DepositRow.id)
    )
    return [(deposit_id, reference) for deposit_id, reference in rows.all()]


async def credited(session: AsyncSession, signatures: list[str]) -> set[str]:
    if not signatures:
        return set()
    rows = await session.scalars(
        select(DepositArrivalRow.signature).where(DepositArrivalRow.signature.in_(signatures))
    )
    return set(rows.all())


async def credit(
    session: AsyncSession, deposit_id: str, signature: str, amount_micro: int, now: datetime
) -> bool:
    """Credit the deposit's tenant with what the transfer `signature` brought, once:
    False when it was credited before."""
    row = await session.get(DepositRow, deposit_id)
    if row is None or amount_micro <= 0:
        return False
    posted = await ledger.post(
        session,
        cause=f"deposit:{signature}",
        kind=TransactionKind.TOP_UP,
        entries=ledger.transfer(ledger.WORLD, ledger.tenant_balance(row.tenant_id), amount_micro),
        now=now,
        details={
            "tenant_id": row.tenant_id,
            "amount_micro": amount_micro,
            "reference": signature,
            "deposit_id": deposit_id,
            "by": "usdc",
        },
    )
    if posted:
        session.add(
            DepositArrivalRow(
                signature=signature,
                deposit_id=deposit_id,
                amount_micro=amount_micro,
                arrived_at=now,
            )
        )
        await session.flush()
        await events.emit(
            session,
            owner_id=row.tenant_id,
            event_type="topup.credited",
            data={"amount": usdc_text(amount_micro), "reference": signature, "via": "usdc"},
            cause=f"deposit:{signature}",
            now=now,
        )
    return posted


async def of_tenant(
    session: AsyncSession, tenant_id: str, target: DepositTarget | None, limit: int = 20
) -> list[Deposit]:
    """The tenant's latest requests, newest first, each with what arrived."""
    if target is None:
        return []
    rows = (
        await session.scalars(
            select(DepositRow)
            .where(DepositRow.tenant_id == tenant_id)
            .order_by(DepositRow.created_at.desc(), DepositRow.id.desc())
            .limit(limit)
        )
    ).all()
    arrivals = (
        await session.scalars(
            select(DepositArrivalRow)
            .where(DepositArrivalRow.deposit_id.in_([row.id for row in rows]))
            .order_by(DepositArrivalRow.arrived_at, DepositArrivalRow.signature)
        )
    ).all()
    return [
        _deposit_of(row, [a for a in arrivals if a.deposit_id == row.id], target) for row in rows
    ]


def _deposit_of(
    row: DepositRow, arrivals: list[DepositArrivalRow], target: DepositTarget
) -> Deposit:
    query = {"spl-token": str(target.mint), "reference": row.reference, "label": "GPU Share"}
    if row.amount_hint_micro:
        query = {"amount": usdc_text(row.amount_hint_micro), **query}
    link = f"solana:{target.wallet}?{urlencode(query, quote_via=quote)}"
    return Deposit(
        id=row.id,
        address=str(target.account),
        wallet=str(target.wallet),
        mint=str(target.mint),
        reference=row.reference,
        amount=usdc_text(row.amount_hint_micro) if row.amount_hint_micro else None,
        solana_pay_url=link,
        created_at=row.created_at,
        expires_at=row.expires_at,
        received=usdc_text(sum(a.amount_micro for a in arrivals)),
        arrivals=[
            DepositArrival(
                signature=a.signature, amount=usdc_text(a.amount_micro), arrived_at=a.arrived_at
            )
            for a in arrivals
        ],
    )
