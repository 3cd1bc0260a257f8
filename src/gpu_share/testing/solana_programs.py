"""What the SPL Token, Associated Token Account and Memo programs would do with a
transaction, for the test Solana node (`solana_rpc`): checked as a cluster checks it,
refused with the error a node answers."""

import struct
from dataclasses import dataclass
from typing import Any

from solders.pubkey import Pubkey
from solders.transaction import Transaction

from gpu_share.coordinator.services.money.solana.transfers import (
    ASSOCIATED_TOKEN_PROGRAM,
    MEMO_PROGRAM,
    TOKEN_PROGRAM,
    TRANSFER_CHECKED,
    USDC_DECIMALS,
    token_account,
)


class Refused(Exception):
    def __init__(self, message: str, code: int = -32002) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class TokenAccount:
    owner: Pubkey
    mint: Pubkey
    amount: int

    def data(self) -> bytes:
        """The SPL Token account layout (165 bytes), initialized."""
        none32 = bytes(36)
        return (
            bytes(self.mint)
            + bytes(self.owner)
            + struct.pack("<Q", self.amount)
            + none32
            + bytes([1])
            + bytes(12)
            + struct.pack("<Q", 0)
            + none32
        )


def simulate(
    transaction: Transaction, accounts: dict[Pubkey, TokenAccount]
) -> tuple[dict[str, list[Any]], str]:
    """What the transaction would do to `accounts` (which it leaves alone): the accounts
    it creates, (address, owner, mint), and the transfers, (source, destination,
    amount); and its memo. Refused, saying why, when a cluster would refuse it."""
    message = transaction.message
    keys = message.account_keys
    signers = set(message.signer_keys())
    pending = {a: TokenAccount(t.owner, t.mint, t.amount) for a, t in accounts.items()}
    moves: dict[str, list[Any]] = {"create": [], "transfer": []}
    memo = ""
    for index, instruction in enumerate(message.instructions):
        program = keys[instruction.program_id_index]
        named = [keys[i] for i in instruction.accounts]
        data = bytes(instruction.data)
        fail = f"Transaction simulation failed: Error processing Instruction {index}: "
        if program == MEMO_PROGRAM:
            memo = data.decode(errors="replace")
        elif program == ASSOCIATED_TOKEN_PROGRAM:
            if data not in (b"", b"\x00", b"\x01") or len(named) < 6:
                raise Refused(fail + "invalid instruction data")
            payer, address, owner, mint = named[:4]
            if payer not in signers:
                raise Refused(fail + "missing required signature for instruction")
            if address != token_account(owner, mint):
                raise Refused(fail + "Provided seeds do not result in a valid address")
            if address in pending and data == b"\x00":
                raise Refused(fail + "account already in use")
            pending.setdefault(address, TokenAccount(owner, mint, 0))
            moves["create"].append((address, owner, mint))
        elif program == TOKEN_PROGRAM:
            if len(data) != 10 or data[0] != TRANSFER_CHECKED or len(named) < 4:
                raise Refused(fail + "only TransferChecked is expected here")
            amount, decimals = struct.unpack("<QB", data[1:])
            source, mint, destination, authority = named[:4]
            if decimals != USDC_DECIMALS:
                raise Refused(fail + "custom program error: 0x12 (decimals mismatch)")
            if source not in pending or destination not in pending:
                raise Refused(fail + "invalid account data for instruction")
            if pending[source].owner != authority or authority not in signers:
                raise Refused(fail + "custom program error: 0x4 (owner does not match)")
            if pending[destination].mint != mint or pending[source].mint != mint:
                raise Refused(fail + "custom program error: 0x3 (mint mismatch)")
            if pending[source].amount < amount:
                raise Refused(fail + "custom program error: 0x1 (insufficient funds)")
            pending[source].amount -= amount
            pending[destination].amount += amount
            moves["transfer"].append((source, destination, amount))
        else:
            raise Refused(fail + f"unexpected program {program}")
    if not moves["transfer"]:
        raise Refused("Transaction simulation failed: the transaction moves no USDC")
    return moves, memo
