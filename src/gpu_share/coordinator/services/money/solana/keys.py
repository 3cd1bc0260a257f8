"""The platform's payout keypair: read from a file in solana-keygen's JSON format (64
numbers) or from a secret setting (that JSON, or the base58 secret key).

The secret never leaves this module's `PayoutKey`: it is not logged, not stored in the
database, and its repr shows only the public key.
"""

import json
from pathlib import Path

from pydantic import SecretStr
from solders.keypair import Keypair
from solders.pubkey import Pubkey


class KeypairError(ValueError):
    """The configured keypair cannot be read; the message never quotes the secret."""


class PayoutKey:
    __slots__ = ("_keypair",)

    def __init__(self, keypair: Keypair) -> None:
        self._keypair = keypair

    @property
    def keypair(self) -> Keypair:
        return self._keypair

    @property
    def public_key(self) -> Pubkey:
        return self._keypair.pubkey()

    def __repr__(self) -> str:
        return f"PayoutKey(public_key={self.public_key})"

    __str__ = __repr__


def _from_text(text: str, where: str) -> PayoutKey:
    text = text.strip()
    try:
        if text.startswith("["):
            numbers = json.loads(text)
            if not isinstance(numbers, list) or len(numbers) != 64:
                raise KeypairError(f"{where}: a keypair is a JSON list of 64 numbers")
            return PayoutKey(Keypair.from_bytes(bytes(numbers)))
        return PayoutKey(Keypair.from_base58_string(text))
    except KeypairError:
        raise
    except (ValueError, TypeError):
        raise KeypairError(
            f"{where} is not a Solana keypair (solana-keygen's JSON file, or the base58 secret key)"
        ) from None


def load(path: Path | None, secret: SecretStr | None) -> PayoutKey | None:
    """The keypair from `secret` if set, else from the file at `path`; None if neither."""
    if secret is not None and secret.get_secret_value().strip():
        return _from_text(secret.get_secret_value(), "GPUSHARE_SOLANA_PAYOUT_KEYPAIR")
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeypairError(f"cannot read the payout keypair file {path}: {exc.strerror}") from None
    return _from_text(text, f"the payout keypair file {path}")
