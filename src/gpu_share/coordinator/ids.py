"""Object ids: a type prefix, then a time-ordered random part (like a ULID)."""

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _base32(number: int, length: int) -> str:
    chars = []
    for _ in range(length):
        number, digit = divmod(number, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """`prefix_` + 10 chars of milliseconds + 16 random chars; sorts by creation time."""
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_base32(millis, 10)}{_base32(secrets.randbits(80), 16)}"
