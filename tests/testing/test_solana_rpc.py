"""The test Solana node refuses what a cluster would: a bad signature, another mint,
wrong decimals, a transfer signed by someone not the source's owner, more than the
source holds, an unknown or expired blockhash, an account at the wrong address."""

import base64
import struct
from collections.abc import Callable

import pytest
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import Transaction

from gpu_share.coordinator.services.money.solana import transfers
from gpu_share.testing.solana_programs import Refused
from gpu_share.testing.solana_rpc import SolanaNode

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")


def send(node: SolanaNode, tx: Transaction) -> str:
    encoded = base64.b64encode(bytes(tx)).decode()
    return str(node.send_transaction([encoded, {"encoding": "base64"}]))


def signed(node: SolanaNode, payer: Keypair, *instructions: Instruction) -> Transaction:
    blockhash = Hash.from_string(node.get_latest_blockhash([])["value"]["blockhash"])
    message = Message.new_with_blockhash(list(instructions), payer.pubkey(), blockhash)
    return Transaction([payer], message, blockhash)


def transfer(payer: Pubkey, owner: Pubkey, amount: int, mint: Pubkey = MINT) -> Instruction:
    return transfers.transfer_checked(payer, owner, mint, amount)


@pytest.fixture
def node() -> SolanaNode:
    return SolanaNode(MINT)


def test_a_good_transfer_lands_once_and_moves_the_amount(node: SolanaNode) -> None:
    payer, wallet = Keypair(), Keypair().pubkey()
    node.fund(payer.pubkey(), 100)
    tx = signed(
        node,
        payer,
        transfers.create_account(payer.pubkey(), wallet, MINT),
        transfer(payer.pubkey(), wallet, 60),
    )
    assert send(node, tx) == send(node, tx) == str(tx.signatures[0])  # a duplicate is kept once
    assert node.balance(wallet) == 60 and node.balance(payer.pubkey()) == 40
    [status] = node.get_signature_statuses([[str(tx.signatures[0])]])["value"]
    assert status["confirmationStatus"] == "finalized" and status["err"] is None


def _decimals(payer: Keypair, wallet: Pubkey) -> Instruction:
    bad = transfer(payer.pubkey(), wallet, 1)
    data = struct.pack("<BQB", 12, 1, 9)
    return Instruction(bad.program_id, data, bad.accounts)


def _other_mint(payer: Keypair, wallet: Pubkey) -> Instruction:
    ix = transfer(payer.pubkey(), wallet, 1)
    accounts = list(ix.accounts)
    accounts[1] = AccountMeta(Keypair().pubkey(), is_signer=False, is_writable=False)
    return Instruction(ix.program_id, ix.data, accounts)


def _not_owner(payer: Keypair, wallet: Pubkey) -> Instruction:
    thief = Keypair().pubkey()
    ix = transfer(payer.pubkey(), wallet, 1)
    accounts = [*ix.accounts[:3], AccountMeta(thief, is_signer=False, is_writable=False)]
    return Instruction(ix.program_id, ix.data, accounts)


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (_other_mint, "mint mismatch"),
        (lambda p, w: transfer(p.pubkey(), w, 1, Keypair().pubkey()), "invalid account data"),
        (_decimals, "decimals mismatch"),
        (_not_owner, "owner does not match"),
        (lambda p, w: transfer(p.pubkey(), w, 101), "insufficient funds"),
        (lambda p, w: transfer(p.pubkey(), Keypair().pubkey(), 1), "invalid account data"),
    ],
)
def test_a_wrong_transfer_is_refused_and_moves_nothing(
    node: SolanaNode, build: Callable[[Keypair, Pubkey], Instruction], why: str
) -> None:
    payer, wallet = Keypair(), Keypair().pubkey()
    node.fund(payer.pubkey(), 100)
    node.fund(wallet, 0)
    with pytest.raises(Refused, match=why):
        send(node, signed(node, payer, build(payer, wallet)))
    assert node.balance(payer.pubkey()) == 100 and node.transfers == []


def test_a_bad_signature_and_a_stale_blockhash_are_refused(node: SolanaNode) -> None:
    payer, wallet = Keypair(), Keypair().pubkey()
    node.fund(payer.pubkey(), 100)
    node.fund(wallet, 0)
    tx = signed(node, payer, transfer(payer.pubkey(), wallet, 1))
    forged = Transaction.populate(tx.message, [Signature.new_unique()])
    with pytest.raises(Refused, match="signature verification") as refused:
        send(node, forged)
    assert refused.value.code == -32003
    node.expire()
    with pytest.raises(Refused, match="Blockhash not found"):
        send(node, tx)
    wrong_address = transfers.create_account(payer.pubkey(), wallet, MINT)
    accounts = list(wrong_address.accounts)
    accounts[1] = AccountMeta(Keypair().pubkey(), is_signer=False, is_writable=True)
    with pytest.raises(Refused, match="valid address"):
        send(
            node,
            signed(
                node,
                payer,
                Instruction(wrong_address.program_id, wrong_address.data, accounts),
                transfer(payer.pubkey(), wallet, 1),
            ),
        )
    assert node.transfers == []
