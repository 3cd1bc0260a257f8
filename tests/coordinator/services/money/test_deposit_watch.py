"""What a transaction brought the platform's USDC account, read from its token balances
as `getTransaction` answers them (legacy and v0 transactions)."""

from typing import Any

from solders.keypair import Keypair
from solders.pubkey import Pubkey

from gpu_share.coordinator.services.money.deposit_watch import received_micro
from gpu_share.coordinator.services.money.deposits import DepositTarget

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
TARGET = DepositTarget(Keypair().pubkey(), MINT, 3600.0)
PAYER = str(Keypair().pubkey())


def balance(index: int, amount: int, *, mint: Pubkey = MINT) -> dict[str, Any]:
    return {
        "accountIndex": index,
        "mint": str(mint),
        "owner": str(TARGET.wallet),
        "uiTokenAmount": {"amount": str(amount), "decimals": 6},
    }


def answer(keys: list[str], pre: int, post: int, **meta: Any) -> dict[str, Any]:
    index = len(keys) - 1 if str(TARGET.account) in keys else 2
    return {
        "transaction": {"message": {"accountKeys": keys}},
        "meta": {
            "err": None,
            "preTokenBalances": [balance(index, pre)],
            "postTokenBalances": [balance(index, post)],
            **meta,
        },
    }


def test_the_amount_is_what_the_platform_account_gained() -> None:
    legacy = answer([PAYER, str(TARGET.account)], pre=5_000_000, post=7_500_000)
    assert received_micro(legacy, TARGET) == 2_500_000


def test_an_account_loaded_from_a_lookup_table_is_found_by_its_index() -> None:
    # v0: the index counts the message's keys, then the loaded writable, then read-only.
    v0 = answer(
        [PAYER, str(Keypair().pubkey())],
        pre=0,
        post=1_000_000,
        loadedAddresses={"writable": [str(TARGET.account)], "readonly": []},
    )
    assert received_micro(v0, TARGET) == 1_000_000


def test_a_failed_transaction_or_another_account_brings_nothing() -> None:
    failed = answer([PAYER, str(TARGET.account)], pre=0, post=1_000_000)
    failed["meta"]["err"] = {"InstructionError": [0, "Custom"]}
    assert received_micro(failed, TARGET) == 0
    elsewhere = answer([PAYER, str(Keypair().pubkey()), str(Keypair().pubkey())], 0, 9)
    assert received_micro(elsewhere, TARGET) == 0
