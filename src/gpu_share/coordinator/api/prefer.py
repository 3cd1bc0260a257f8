"""The `Prefer` request header (RFC 7240): what a client would like, never what it needs.

Only `wait` is read (`Prefer: wait=10`, or `respond-async, wait=10`: "answer with the
result if you have it within ten seconds, else as you would have"). Every other
preference is ignored, as the RFC asks of a server that does not support one; of a
preference named twice only the first counts. A `wait` this server cannot honour is
an error that says what to send, not a silent no-op, so a client never believes it
asked for something it did not.
"""

import re

from gpu_share.coordinator.core.errors import ValidationFailed

_PREFERENCE = re.compile(
    # name [= value] [; parameters], value a token or a quoted string
    r'\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*(?:=\s*("[^"]*"|[^;,\s]*))?\s*(?:;[^,]*)?'
)
_SECONDS = re.compile(r"[0-9]{1,6}")
_ITEM = re.compile(r'(?:[^,"]|"[^"]*")+')


def wait_preference(headers: list[str] | None, most: float) -> int | None:
    """The seconds `Prefer: wait=N` asks for (0 to `most`), or None when it is not asked.

    A bare `wait` (no value) asks for the most this server holds a request."""
    for header in headers or []:
        for piece in _split(header):
            found = _PREFERENCE.fullmatch(piece)
            if found is None:
                raise ValidationFailed(
                    f"Prefer: {piece.strip()!r} is not a preference; send e.g. 'Prefer: wait=10'"
                )
            name, value = found.group(1).lower(), found.group(2)
            if name != "wait":
                continue
            if value is None or value == "":
                return int(most)
            seconds = value.strip('"')
            if _SECONDS.fullmatch(seconds) is None or int(seconds) > most:
                raise ValidationFailed(
                    f"Prefer: wait={value} must be whole seconds from 0 to {most:g}, "
                    f"e.g. 'Prefer: wait=10'"
                )
            return int(seconds)
    return None


def _split(header: str) -> list[str]:
    """The comma-separated preferences of one header line, commas in quotes kept."""
    return [piece for piece in _ITEM.findall(header) if piece.strip()]
