"""The SPL-token transfer of one payout, built and signed with solders.

One legacy transaction, fee paid by the payout keypair:

1. (when the provider has no USDC account yet) the Associated Token Account program's
   CreateIdempotent: the provider's associated token account for the mint, paid for by
   the platform;
2. SPL Token TransferChecked from the platform's associated token account to the
   provider's, of the exact amount in micro-USDC with the mint's 6 decimals;
3. a Memo with the payout's id, which makes every payout's transaction (and so its
   signature) distinct, even two of the same amount to the same wallet.
"""

import struct
from dataclasses import dataclass

from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.message import Message
from solders.pubkey import Pubkey
from solders.system_program import ID as SYSTEM_PROGRAM
from solders.token.associated import get_associated_token_address
from solders.transaction import Transaction

from gpu_share.coordinator.services.money.solana.keys import PayoutKey

TOKEN_PROGRAM = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
ASSOCIATED_TOKEN_PROGRAM = Pubkey.from_string("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")
MEMO_PROGRAM = Pubkey.from_string("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr")
USDC_DECIMALS = 6
TRANSFER_CHECKED = 12  # SPL Token instruction index
CREATE_IDEMPOTENT = 1  # Associated Token Account instruction index


def token_account(owner: Pubkey, mint: Pubkey) -> Pubkey:
    """The owner's associated token account for `mint`."""
    return get_associated_token_address(owner, mint, TOKEN_PROGRAM)


def create_account(payer: Pubkey, owner: Pubkey, mint: Pubkey) -> Instruction:
    accounts = [
        AccountMeta(payer, is_signer=True, is_writable=True),
        AccountMeta(token_account(owner, mint), is_signer=False, is_writable=True),
        AccountMeta(owner, is_signer=False, is_writable=False),
        AccountMeta(mint, is_signer=False, is_writable=False),
        AccountMeta(SYSTEM_PROGRAM, is_signer=False, is_writable=False),
        AccountMeta(TOKEN_PROGRAM, is_signer=False, is_writable=False),
    ]
    return Instruction(ASSOCIATED_TOKEN_PROGRAM, bytes([CREATE_IDEMPOTENT]), accounts)


def transfer_checked(payer: Pubkey, owner: Pubkey, mint: Pubkey, amount_micro: int) -> Instruction:
    accounts = [
        AccountMeta(token_account(payer, mint), is_signer=False, is_writable=True),
        AccountMeta(mint, is_signer=False, is_writable=False),
        AccountMeta(token_account(owner, mint), is_signer=False, is_writable=True),
        AccountMeta(payer, is_signer=True, is_writable=False),
    ]
    data = struct.pack("<BQB", TRANSFER_CHECKED, amount_micro, USDC_DECIMALS)
    return Instruction(TOKEN_PROGRAM, data, accounts)


def memo(text: str) -> Instruction:
    return Instruction(MEMO_PROGRAM, text.encode(), [])


@dataclass(frozen=True)
class SignedTransfer:
    transaction: bytes  # the wire form sendTransaction takes (before base64)
    signature: str


def build(
    key: PayoutKey,
    *,
    destination: Pubkey,
    mint: Pubkey,
    amount_micro: int,
    payout_id: str,
    blockhash: str,
    create_destination: bool,
) -> SignedTransfer:
    """The payout's transaction, signed by the payout keypair, valid with `blockhash`."""
    if amount_micro <= 0:
        raise ValueError("a transfer moves a positive amount")
    payer = key.public_key
    instructions = [create_account(payer, destination, mint)] if create_destination else []
    instructions += [transfer_checked(payer, destination, mint, amount_micro), memo(payout_id)]
    recent = Hash.from_string(blockhash)
    message = Message.new_with_blockhash(instructions, payer, recent)
    transaction = Transaction([key.keypair], message, recent)
    return SignedTransfer(bytes(transaction), str(transaction.signatures[0]))
