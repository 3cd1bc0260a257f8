"""Object ids: a type prefix, then a time-ordered random part (like a ULID)."""

import re
import secrets
import time

from gpu_share.coordinator.core.errors import field_error

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


def id_pattern(prefix: str) -> str:
    """The regular expression every id made by `new_id(prefix)` matches."""
    return rf"^{prefix}_[{_ALPHABET}]{{26}}$"


def is_id(prefix: str, value: str) -> bool:
    return re.fullmatch(id_pattern(prefix), value) is not None


def checked_cursor(prefix: str, cursor: str | None) -> str | None:
    """A page cursor (the last id of the previous page), refused when it is not one."""
    if cursor is not None and not is_id(prefix, cursor):
        raise field_error(
            "cursor", "is not a cursor this API returned; pass next_cursor from the previous page"
        )
    return cursor
