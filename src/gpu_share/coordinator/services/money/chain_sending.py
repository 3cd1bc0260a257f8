"""Sends the USDC payouts on Solana and follows each to finalized: the RPC side of
`chain_payouts`, one payout at a time, each step in its own short transaction.

For a payout this replica holds (`chain_payouts.claim`):

- nothing signed yet: take a blockhash, ask whether the provider's USDC account
  exists, sign the transfer, **record it (committed)**, then send it;
- signed before: read the finalized block height *first*, then the signature's status.
  Finalized: paid, or failed if it failed on chain. Seen but not final: wait. Unknown
  while the blockhash is valid: resend the same transaction (the cluster drops a
  duplicate by its signature). Unknown once the finalized height is past the
  blockhash's last valid height: that transaction can never land, so a new one is
  signed and recorded in its place, then sent; or, when the RPC refused it for a
  reason other than its blockhash, the payout fails with that reason (its amount back
  to pending).

Reading the height before the status matters: a transaction that lands before the
height passes is then seen by the status, so a transaction that landed is never
replaced.
"""

import base64
import logging
from dataclasses import dataclass
from enum import StrEnum

from solders.pubkey import Pubkey

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import chain_payouts
from gpu_share.coordinator.services.money.chain_payouts import Limits, Recorded
from gpu_share.coordinator.services.money.solana import keys, transfers
from gpu_share.coordinator.services.money.solana.keys import PayoutKey
from gpu_share.coordinator.services.money.solana.rpc import RpcRejected, RpcUnavailable, SolanaRpc

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    SENT = "sent"  # a newly signed transaction was recorded and sent
    RESENT = "resent"  # the recorded one, again
    REJECTED = "rejected"  # the RPC refused the send; followed on the next run
    LANDING = "landing"  # seen on chain, not yet finalized
    PAID = "paid"
    FAILED = "failed"
    RETRY = "retry"  # the RPC was unreachable: nothing changed
    LOST = "lost"  # another replica moved it first


@dataclass(frozen=True)
class ChainSetup:
    rpc: SolanaRpc
    key: PayoutKey
    mint: Pubkey
    limits: Limits
    claim_sec: float
    base_url: str


def setup_from(settings: Settings) -> ChainSetup | None:
    """None unless both the RPC URL and a payout keypair are configured
    (`Settings.sends_usdc_payouts`, the one rule the pages read too)."""
    if not settings.sends_usdc_payouts or settings.solana_rpc_url is None:
        return None
    key = keys.load(settings.solana_payout_keypair_path, settings.solana_payout_keypair)
    if key is None:
        return None
    rpc = SolanaRpc(
        settings.solana_rpc_url.get_secret_value(),
        commitment=settings.solana_commitment,
        timeout_sec=settings.solana_rpc_timeout_sec,
        attempts=settings.solana_rpc_attempts,
        retry_first_sec=settings.solana_rpc_retry_first_sec,
    )
    limits = Limits(settings.solana_payout_max_micro, settings.solana_payout_daily_max_micro)
    return ChainSetup(
        rpc=rpc,
        key=key,
        mint=Pubkey.from_string(settings.solana_usdc_mint),
        limits=limits,
        claim_sec=settings.solana_send_claim_sec,
        base_url=settings.public_base_url,
    )


async def run(db: Database, clock: Clock, setup: ChainSetup) -> dict[str, Outcome]:
    """Enroll new USDC payouts, then move each one being sent a step: what each did."""
    async with db.write() as session:
        await chain_payouts.enroll(session, clock.now(), setup.limits)
    async with db.read() as session:
        due = await chain_payouts.sendable(session, clock.now())
    done = {}
    for payout_id in due:
        outcome = await advance(db, clock, setup, payout_id)
        if outcome is not None:
            done[payout_id] = outcome
    return done


async def advance(db: Database, clock: Clock, setup: ChainSetup, payout_id: str) -> Outcome | None:
    """One step of one payout; None when another replica holds it."""
    async with db.write() as session:
        held = await chain_payouts.claim(session, payout_id, clock.now(), setup.claim_sec)
    if held is None:
        return None
    try:
        return await _step(db, clock, setup, held)
    except RpcUnavailable as exc:
        log.warning("payout %s waits for the Solana RPC: %s", payout_id, exc)
        return Outcome.RETRY
    finally:
        async with db.write() as session:
            await chain_payouts.release(session, payout_id)


async def _step(db: Database, clock: Clock, setup: ChainSetup, held: Recorded) -> Outcome:
    if held.signature is None or held.transaction is None:
        return await _sign_and_send(db, clock, setup, held, replaces=None)
    height = await setup.rpc.block_height("finalized")
    status = await setup.rpc.signature_status(held.signature)
    if status is not None:
        if status.confirmation != "finalized":
            return Outcome.LANDING
        failure = None if status.err is None else f"the transfer failed on Solana: {status.err}"
        return await _settle(db, clock, setup, held, held.signature, failure)
    if held.last_valid_block_height is None or height <= held.last_valid_block_height:
        return await _send(db, setup, held, held.transaction, held.signature, Outcome.RESENT)
    if held.rejected and "blockhash" not in held.rejected.lower():
        return await _settle(
            db, clock, setup, held, held.signature, f"Solana refused the transfer: {held.rejected}"
        )
    return await _sign_and_send(db, clock, setup, held, replaces=held.signature)


async def _sign_and_send(
    db: Database, clock: Clock, setup: ChainSetup, held: Recorded, *, replaces: str | None
) -> Outcome:
    blockhash = await setup.rpc.latest_blockhash()
    destination = Pubkey.from_string(held.destination)
    account = transfers.token_account(destination, setup.mint)
    exists = await setup.rpc.account_exists(str(account))
    signed = transfers.build(
        setup.key,
        destination=destination,
        mint=setup.mint,
        amount_micro=held.amount_micro,
        payout_id=held.payout_id,
        blockhash=blockhash.blockhash,
        create_destination=not exists,
    )
    encoded = base64.b64encode(signed.transaction).decode()
    async with db.write() as session:
        kept = await chain_payouts.record(
            session,
            held.payout_id,
            replaces=replaces,
            transaction=encoded,
            signature=signed.signature,
            last_valid_block_height=blockhash.last_valid_block_height,
            now=clock.now(),
        )
    if not kept:
        return Outcome.LOST
    return await _send(db, setup, held, encoded, signed.signature, Outcome.SENT)


async def _send(
    db: Database,
    setup: ChainSetup,
    held: Recorded,
    transaction: str,
    signature: str,
    outcome: Outcome,
) -> Outcome:
    try:
        await setup.rpc.send_transaction(base64.b64decode(transaction))
    except RpcRejected as exc:
        log.warning("the Solana RPC refused payout %s's transfer: %s", held.payout_id, exc)
        async with db.write() as session:
            await chain_payouts.note_rejected(session, held.payout_id, signature, exc.message)
        return Outcome.REJECTED
    return outcome


async def _settle(
    db: Database,
    clock: Clock,
    setup: ChainSetup,
    held: Recorded,
    signature: str,
    failure: str | None,
) -> Outcome:
    async with db.write() as session:
        settled = await chain_payouts.settle(
            session,
            held.payout_id,
            signature,
            failure=failure,
            now=clock.now(),
            base_url=setup.base_url,
        )
    if not settled:
        return Outcome.LOST
    return Outcome.PAID if failure is None else Outcome.FAILED
