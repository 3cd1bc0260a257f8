"""A Solana JSON-RPC node for tests: a real HTTP JSON-RPC 2.0 server on loopback that
keeps token accounts and checks every transaction with solders, as a cluster would.

It answers getLatestBlockhash, getBlockHeight, getAccountInfo, sendTransaction
(base64), getSignatureStatuses, getSignaturesForAddress and getTransaction (finalized,
with the token balances before and after); `pay` sends a wallet's Solana Pay transfer.
sendTransaction verifies every signature, the blockhash (known and not expired), and
each instruction: SPL Token TransferChecked between existing accounts of its mint, with
6 decimals, signed by the source's owner; the Associated Token Account program's
Create / CreateIdempotent of the derived address; Memo. What is wrong is refused with
the error a node answers (`-32002 Transaction simulation failed: …`, `-32003` for a bad
signature).

Failure injection: `drop_next` (accepted, never lands), `delay_next` (accepted, lands
at `deliver()` if its blockhash is still valid), `fail_next_on_chain` (lands
with an error, moves nothing), `expire()` (the block height passes every blockhash
given so far), `errors` (the next calls answer HTTP 500, a "node is behind" error, or
hang past the client's timeout), `land_as` ("confirmed": landed transactions wait for
`finalize()`).
"""

import asyncio
import base64
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.transaction import Transaction

from gpu_share.coordinator.services.money.solana.transfers import (
    TOKEN_PROGRAM,
    USDC_DECIMALS,
    token_account,
    transfer_checked,
)
from gpu_share.testing.servers import serve
from gpu_share.testing.solana_programs import Refused, TokenAccount, simulate

VALID_FOR = 150  # blocks a blockhash stays valid, as on Solana


@dataclass(frozen=True)
class Landed:
    signature: str
    source_owner: str
    destination_owner: str
    amount_micro: int
    memo: str


@dataclass
class SolanaNode:
    mint: Pubkey
    block_height: int = 1_000
    accounts: dict[Pubkey, TokenAccount] = field(default_factory=dict)
    blockhashes: dict[str, int] = field(default_factory=dict)  # → last valid block height
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    transfers: list[Landed] = field(default_factory=list)
    history: dict[str, dict[str, Any]] = field(default_factory=dict)  # getTransaction's
    sent: list[str] = field(default_factory=list)  # every signature sendTransaction took
    drop_next: int = 0
    delay_next: int = 0  # accepted, landing only at `deliver()`, if still valid then
    delayed: list[Transaction] = field(default_factory=list)
    fail_next_on_chain: int = 0
    land_as: str = "finalized"
    errors: deque[str] = field(default_factory=deque)  # "http500", "behind", "hang"
    hang_sec: float = 0.5

    # ---- the test's controls --------------------------------------------------------

    def fund(self, owner: Pubkey, amount_micro: int, mint: Pubkey | None = None) -> Pubkey:
        """Give `owner` a token account (USDC unless `mint`) holding `amount_micro`."""
        mint = mint or self.mint
        address = token_account(owner, mint)
        self.accounts[address] = TokenAccount(owner, mint, amount_micro)
        return address

    def balance(self, owner: Pubkey, mint: Pubkey | None = None) -> int | None:
        account = self.accounts.get(token_account(owner, mint or self.mint))
        return None if account is None else account.amount

    def pay(
        self,
        payer: Keypair,
        owner: Pubkey,
        amount: int,
        reference: str,
        mint: Pubkey | None = None,
    ) -> str:
        """A wallet's Solana Pay transfer: TransferChecked from the payer's token account
        to `owner`'s, naming `reference` as a read-only account; its signature."""
        mint = mint or self.mint
        move = transfer_checked(payer.pubkey(), owner, mint, amount)
        named = [*move.accounts, AccountMeta(Pubkey.from_string(reference), False, False)]
        blockhash = Hash.from_string(self.get_latest_blockhash([])["value"]["blockhash"])
        message = Message.new_with_blockhash(
            [Instruction(move.program_id, move.data, named)], payer.pubkey(), blockhash
        )
        transaction = Transaction([payer], message, blockhash)
        encoded = base64.b64encode(bytes(transaction)).decode()
        return str(self.send_transaction([encoded, {"encoding": "base64"}]))

    def expire(self) -> None:
        self.block_height += VALID_FOR + 1

    def finalize(self) -> None:
        for status in self.statuses.values():
            status["confirmationStatus"] = "finalized"
            status["confirmations"] = None

    def received(self, owner: Pubkey) -> list[Landed]:
        return [t for t in self.transfers if t.destination_owner == str(owner)]

    # ---- the methods ------------------------------------------------------------------

    def _context(self) -> dict[str, int]:
        return {"slot": self.block_height + 7}

    def get_latest_blockhash(self, _params: list[Any]) -> Any:
        # A new blockhash each time, as each slot has one: a transaction signed again
        # is a different transaction.
        blockhash = str(Hash.new_unique())
        self.blockhashes[blockhash] = valid = self.block_height + VALID_FOR
        return {
            "context": self._context(),
            "value": {"blockhash": blockhash, "lastValidBlockHeight": valid},
        }

    def get_block_height(self, _params: list[Any]) -> Any:
        return self.block_height

    def get_account_info(self, params: list[Any]) -> Any:
        account = self.accounts.get(Pubkey.from_string(params[0]))
        if account is None:
            return {"context": self._context(), "value": None}
        value = {
            "data": [base64.b64encode(account.data()).decode(), "base64"],
            "executable": False,
            "lamports": 2_039_280,
            "owner": str(TOKEN_PROGRAM),
            "rentEpoch": 18_446_744_073_709_551_615,
            "space": 165,
        }
        return {"context": self._context(), "value": value}

    def get_signature_statuses(self, params: list[Any]) -> Any:
        return {"context": self._context(), "value": [self.statuses.get(s) for s in params[0]]}

    def send_transaction(self, params: list[Any]) -> Any:
        if len(params) < 2 or params[1].get("encoding") != "base64":
            raise Refused("only base64 transactions are taken here", -32602)
        try:
            transaction = Transaction.from_bytes(base64.b64decode(params[0]))
        except ValueError:
            raise Refused("failed to deserialize the transaction", -32602) from None
        try:
            transaction.verify()
        except Exception:  # solders raises its own error type
            raise Refused("Transaction signature verification failure", -32003) from None
        signature = str(transaction.signatures[0])
        self.sent.append(signature)
        if signature in self.statuses:
            return signature  # a duplicate: the cluster keeps the first
        blockhash = str(transaction.message.recent_blockhash)
        if self.blockhashes.get(blockhash, -1) < self.block_height:
            raise Refused("Transaction simulation failed: Blockhash not found")
        simulate(transaction, self.accounts)
        if self.drop_next:
            self.drop_next -= 1
            return signature
        if self.delay_next:
            self.delay_next -= 1
            self.delayed.append(transaction)
            return signature
        self._land(transaction)
        return signature

    def deliver(self) -> None:
        """Delayed transactions land now, those still valid and not landed before."""
        delayed, self.delayed = self.delayed, []
        for transaction in delayed:
            signature = str(transaction.signatures[0])
            blockhash = str(transaction.message.recent_blockhash)
            if signature in self.statuses or self.blockhashes[blockhash] < self.block_height:
                continue
            try:
                self._land(transaction)
            except Refused:
                continue

    def _land(self, transaction: Transaction) -> None:
        signature = str(transaction.signatures[0])
        moves, memo = simulate(transaction, self.accounts)
        keys = transaction.message.account_keys
        before = self._token_balances(keys)
        err: Any = None
        if self.fail_next_on_chain:
            self.fail_next_on_chain -= 1
            err = {"InstructionError": [0, {"Custom": 1}]}
        else:
            for address, owner, mint in moves["create"]:
                self.accounts.setdefault(address, TokenAccount(owner, mint, 0))
            for source, destination, amount in moves["transfer"]:
                self.accounts[source].amount -= amount
                self.accounts[destination].amount += amount
                self.transfers.append(
                    Landed(
                        signature,
                        str(self.accounts[source].owner),
                        str(self.accounts[destination].owner),
                        amount,
                        memo,
                    )
                )
        self.statuses[signature] = {
            "slot": self.block_height + 7,
            "confirmations": None if self.land_as == "finalized" else 1,
            "err": err,
            "status": {"Ok": None} if err is None else {"Err": err},
            "confirmationStatus": self.land_as,
        }
        self.history[signature] = {
            "slot": self.block_height + 7,
            "blockTime": 1_796_000_000,
            "meta": {
                "err": err,
                "fee": 5000,
                "preTokenBalances": before,
                "postTokenBalances": self._token_balances(keys),
            },
            "transaction": {
                "signatures": [str(s) for s in transaction.signatures],
                "message": {"accountKeys": [str(k) for k in keys]},
            },
        }

    def _token_balances(self, keys: list[Pubkey]) -> list[dict[str, Any]]:
        balances = []
        for index, key in enumerate(keys):
            account = self.accounts.get(key)
            if account is not None:
                amount = {"amount": str(account.amount), "decimals": USDC_DECIMALS}
                balances.append(
                    {
                        "accountIndex": index,
                        "mint": str(account.mint),
                        "owner": str(account.owner),
                        "programId": str(TOKEN_PROGRAM),
                        "uiTokenAmount": amount,
                    }
                )
        return balances

    def get_signatures_for_address(self, params: list[Any]) -> Any:
        address = params[0]
        named = [
            sig
            for sig, tx in self.history.items()
            if address in tx["transaction"]["message"]["accountKeys"]
            and self.statuses[sig]["confirmationStatus"] == "finalized"
        ]
        return [
            {
                "signature": sig,
                "slot": self.history[sig]["slot"],
                "err": self.statuses[sig]["err"],
                "memo": None,
                "blockTime": self.history[sig]["blockTime"],
                "confirmationStatus": "finalized",
            }
            for sig in reversed(named)
        ]

    def get_transaction(self, params: list[Any]) -> Any:
        found = self.history.get(params[0])
        if found is None or self.statuses[params[0]]["confirmationStatus"] != "finalized":
            return None
        return found

    # ---- the server -------------------------------------------------------------------

    def app(self) -> FastAPI:
        app = FastAPI()
        methods = {
            "getLatestBlockhash": self.get_latest_blockhash,
            "getBlockHeight": self.get_block_height,
            "getAccountInfo": self.get_account_info,
            "getSignatureStatuses": self.get_signature_statuses,
            "sendTransaction": self.send_transaction,
            "getSignaturesForAddress": self.get_signatures_for_address,
            "getTransaction": self.get_transaction,
        }

        @app.post("/")
        async def rpc(request: Request) -> JSONResponse:
            body = await request.json()
            request_id = body.get("id")
            if self.errors:
                error = self.errors.popleft()
                if error == "http500":
                    return JSONResponse({"message": "internal error"}, status_code=500)
                if error == "hang":
                    await asyncio.sleep(self.hang_sec)
                if error == "behind":
                    failure = {"code": -32005, "message": "Node is behind by 42 slots"}
                    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": failure})
            method = methods.get(body.get("method"))
            if method is None:
                failure = {"code": -32601, "message": "Method not found"}
                return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": failure})
            try:
                result = method(body.get("params") or [])
            except Refused as exc:
                failure = {"code": exc.code, "message": exc.message}
                return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": failure})
            return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result})

        return app


@asynccontextmanager
async def solana_node(mint: Pubkey) -> AsyncIterator[tuple[SolanaNode, str]]:
    """A node on a free loopback port: it and its URL."""
    node = SolanaNode(mint)
    async with serve(node.app(), lifespan=False) as url:
        yield node, url + "/"
