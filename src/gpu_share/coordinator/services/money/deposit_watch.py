"""Looks up the transfers that name each open deposit request and credits them: the
RPC side of `deposits`.

For each request still watched: `getSignaturesForAddress(reference)` (finalized only);
for each signature that succeeded and is not yet credited, `getTransaction`, and the
amount is the platform's USDC account's balance after minus before (its
`postTokenBalances` − `preTokenBalances`, matched by account, mint and owner). A
transfer of another token, to another account, or that failed, brings nothing and is
not credited; a partial amount is credited as received.
"""

import logging
from typing import Any

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.services.money import deposits
from gpu_share.coordinator.services.money.deposits import DepositTarget
from gpu_share.coordinator.services.money.solana.rpc import RpcRejected, RpcUnavailable, SolanaRpc

log = logging.getLogger(__name__)


def received_micro(transaction: dict[str, Any], target: DepositTarget) -> int:
    """What the transaction added to the platform's USDC account (0 if nothing)."""
    meta = transaction.get("meta") or {}
    if meta.get("err") is not None:
        return 0
    # A balance's accountIndex counts the message's own keys, then those a v0 transaction
    # loaded from lookup tables (writable, then read-only).
    loaded = meta.get("loadedAddresses") or {}
    keys = [
        *transaction.get("transaction", {}).get("message", {}).get("accountKeys", []),
        *loaded.get("writable", []),
        *loaded.get("readonly", []),
    ]
    account, mint, owner = str(target.account), str(target.mint), str(target.wallet)

    def held(balances: list[dict[str, Any]] | None) -> int:
        total = 0
        for entry in balances or []:
            index = entry.get("accountIndex")
            named = keys[index] if isinstance(index, int) and index < len(keys) else None
            if named == account and entry.get("mint") == mint and entry.get("owner") == owner:
                total += int(entry.get("uiTokenAmount", {}).get("amount", "0"))
        return total

    return max(0, held(meta.get("postTokenBalances")) - held(meta.get("preTokenBalances")))


async def run(db: Database, clock: Clock, rpc: SolanaRpc, target: DepositTarget) -> list[str]:
    """The signatures credited by this run."""
    async with db.read() as session:
        watched = await deposits.open_requests(session, clock.now())
    done = []
    for deposit_id, reference in watched:
        try:
            found = await rpc.signatures_for_address(reference)
            landed = [s["signature"] for s in found if s.get("err") is None]
            async with db.read() as session:
                seen = await deposits.credited(session, landed)
            for signature in landed:
                if signature in seen:
                    continue
                transaction = await rpc.transaction(signature)
                amount = received_micro(transaction or {}, target)
                if amount <= 0:
                    continue
                async with db.write() as session:
                    if await deposits.credit(session, deposit_id, signature, amount, clock.now()):
                        done.append(signature)
        except RpcUnavailable as exc:
            log.warning("deposit %s waits for the Solana RPC: %s", deposit_id, exc)
        except RpcRejected as exc:  # this request's lookups only: the others go on
            log.warning("the Solana RPC refused deposit %s's lookups: %s", deposit_id, exc)
    return done
