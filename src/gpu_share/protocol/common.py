"""Small shared types of the wire contract."""

import re
from datetime import datetime
from typing import Annotated, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, Field

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _sha256_hex(value: str) -> str:
    lowered = value.strip().lower()
    if not SHA256_RE.fullmatch(lowered):
        raise ValueError("must be a SHA-256 digest: 64 hexadecimal characters")
    return lowered


Sha256Hex = Annotated[str, AfterValidator(_sha256_hex)]

_EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")


def _email(value: str) -> str:
    value = value.strip()
    if len(value) > 254 or not _EMAIL_RE.fullmatch(value):
        raise ValueError("must be an email address such as name@example.com")
    return value


Email = Annotated[str, AfterValidator(_email)]

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """A page of a list; pass `next_cursor` back as `cursor` for the next one."""

    items: list[T]
    next_cursor: str | None = Field(default=None, description="Opaque; absent on the last page")


class Timestamped(BaseModel):
    created_at: datetime
