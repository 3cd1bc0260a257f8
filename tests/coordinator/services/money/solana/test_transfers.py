"""The payout's transaction as solders builds it: the derived token accounts, the
exact amount with 6 decimals, signed by the payout key, a distinct signature per payout."""

import struct

import pytest
from solders.hash import Hash
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.transaction import Transaction

from gpu_share.coordinator.services.money.solana import transfers
from gpu_share.coordinator.services.money.solana.keys import PayoutKey

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")


def test_the_token_account_is_the_associated_program_address() -> None:
    owner = Keypair().pubkey()
    seeds = [bytes(owner), bytes(transfers.TOKEN_PROGRAM), bytes(MINT)]
    expected, _bump = Pubkey.find_program_address(seeds, transfers.ASSOCIATED_TOKEN_PROGRAM)
    assert transfers.token_account(owner, MINT) == expected


def test_a_transfer_moves_the_exact_amount_signed_by_the_payout_key() -> None:
    key = PayoutKey(Keypair())
    wallet = Keypair().pubkey()
    blockhash = str(Hash.new_unique())

    def signed(payout_id: str, create: bool) -> transfers.SignedTransfer:
        return transfers.build(
            key,
            destination=wallet,
            mint=MINT,
            amount_micro=123_456_789,
            payout_id=payout_id,
            blockhash=blockhash,
            create_destination=create,
        )

    one = signed("pay_one", create=False)
    tx = Transaction.from_bytes(one.transaction)
    tx.verify()
    assert str(tx.signatures[0]) == one.signature
    assert str(tx.message.recent_blockhash) == blockhash
    keys = tx.message.account_keys
    move = tx.message.instructions[0]
    assert keys[move.program_id_index] == transfers.TOKEN_PROGRAM
    assert struct.unpack("<BQB", bytes(move.data)) == (12, 123_456_789, 6)
    source, mint, destination, owner = (keys[i] for i in move.accounts)
    assert source == transfers.token_account(key.public_key, MINT) and mint == MINT
    assert destination == transfers.token_account(wallet, MINT) and owner == key.public_key
    # the same amount to the same wallet for another payout is another transaction
    assert signed("pay_two", create=False).signature != one.signature
    created = Transaction.from_bytes(signed("pay_one", create=True).transaction)
    assert created.message.account_keys[created.message.instructions[0].program_id_index] == (
        transfers.ASSOCIATED_TOKEN_PROGRAM
    )
    with pytest.raises(ValueError, match="positive"):
        transfers.build(
            key,
            destination=wallet,
            mint=MINT,
            amount_micro=0,
            payout_id="pay_zero",
            blockhash=blockhash,
            create_destination=False,
        )
