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

# One plain address: no space, control character, or character that would make the
# text a list of addresses or a display name ("a,b@x", "Eve <e@x>", quotes, brackets).
_EMAIL_CHAR = r"[^@\s\x00-\x1f\x7f-\x9f\"(),:;<>\[\\\]]"
_EMAIL_RE = re.compile(rf"^{_EMAIL_CHAR}{{1,64}}@{_EMAIL_CHAR}+\.{_EMAIL_CHAR}+$")


def is_email(value: str) -> bool:
    """Whether `value` is one plain email address (what mail may be sent to)."""
    return len(value) <= 254 and _EMAIL_RE.fullmatch(value) is not None


def _email(value: str) -> str:
    value = value.strip()
    if not is_email(value):
        raise ValueError("must be an email address such as name@example.com")
    return value


Email = Annotated[str, AfterValidator(_email)]

T = TypeVar("T")


class ApplicationSubmitted(BaseModel):
    """What applying answers: the same whether or not this email has applied before, so it
    tells no one who has. The application counts (is reviewed, and is the one open
    application of its email) once the link mailed to the email is opened."""

    email: str = Field(description="Where the link to confirm the application was mailed")
    confirm_within_days: int = Field(
        description="An application not confirmed in this time is deleted"
    )
    message: str


class Page(BaseModel, Generic[T]):
    """A page of a list; pass `next_cursor` back as `cursor` for the next one."""

    items: list[T]
    next_cursor: str | None = Field(default=None, description="Opaque; absent on the last page")


class Timestamped(BaseModel):
    created_at: datetime
