"""The payout keypair: from solana-keygen's JSON file or a secret setting (JSON or
base58), never shown in a repr or an error."""

import json
from pathlib import Path

import pytest
from pydantic import SecretStr
from solders.keypair import Keypair

from gpu_share.coordinator.services.money.solana.keys import KeypairError, load


def test_a_keygen_file_and_a_secret_give_the_same_key_and_the_repr_shows_only_the_public_one(
    tmp_path: Path,
) -> None:
    keypair = Keypair()
    path = tmp_path / "payout.json"
    path.write_text(json.dumps(list(bytes(keypair))))
    from_file = load(path, None)
    from_json = load(None, SecretStr(json.dumps(list(bytes(keypair)))))
    from_base58 = load(path / "ignored", SecretStr(str(keypair)))  # the secret wins
    assert from_file and from_json and from_base58
    assert {k.public_key for k in (from_file, from_json, from_base58)} == {keypair.pubkey()}
    shown = repr(from_file) + str(from_file)
    assert str(keypair.pubkey()) in shown and str(keypair) not in shown
    assert load(None, None) is None and load(None, SecretStr("  ")) is None


@pytest.mark.parametrize(
    "text", ["[1, 2, 3]", "not a key at all", "[" + ",".join(["300"] * 64) + "]", "{}"]
)
def test_a_bad_keypair_is_refused_without_quoting_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "payout.json"
    path.write_text(text)
    with pytest.raises(KeypairError) as raised:
        load(path, None)
    assert text not in str(raised.value) and "keypair" in str(raised.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeypairError, match="cannot read the payout keypair file"):
        load(tmp_path / "nowhere.json", None)
