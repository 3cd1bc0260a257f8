"""What a mail's headers may carry. Subjects name things that nodes, applicants and
tenants chose (a hostname, a GPU's model); a line break in one would end the header and
start another (a `Bcc:` of the sender's choosing), and an overlong one overflows the
outbox's column. So every such value goes through `header_text`, and a recipient must
be one plain address or the mail is not built at all."""

import unicodedata

from gpu_share.protocol.common import is_email

SUBJECT_MAX = 300  # the outbox's column
ELLIPSIS = "…"


def header_text(value: str, limit: int = SUBJECT_MAX) -> str:
    """`value` on one line: control and line-separator characters become spaces, runs of
    spaces one, and what is longer than `limit` is cut with an ellipsis."""
    cleaned = "".join(
        " " if unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029\x85" else ch
        for ch in value
    )
    text = " ".join(cleaned.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + ELLIPSIS


def recipient_problem(address: str) -> str | None:
    """Why `address` cannot be a mail's one recipient; None when it can."""
    if is_email(address) and address == address.strip():
        return None
    return f"the recipient {header_text(address, 120)!r} is not one valid email address"
