"""What people call things: an artifact's file name, a machine's label.

Both are shown on pages and in mails next to data other people chose, so they are one
line of printable text: no control characters, no line breaks, nothing but the name.
"""

from typing import Annotated

from pydantic import AfterValidator

ARTIFACT_NAME_MAX = 200
NODE_LABEL_MAX = 64


def display_text(raw: str, *, max_length: int) -> str:
    """`raw` trimmed, or ValueError saying what is wrong with it."""
    text = raw.strip()
    if not text:
        raise ValueError("must not be empty or only spaces")
    if len(text) > max_length:
        raise ValueError(f"must be at most {max_length} characters, not {len(text)}")
    if not text.isprintable():  # control characters, line breaks, tabs, format marks
        raise ValueError("must be printable text: no control characters, tabs or line breaks")
    return text


def file_name(raw: str) -> str:
    """The name of an uploaded file, without any directory a browser or client sent
    (`C:\\fakepath\\model.onnx` and `runs/7/model.onnx` are both `model.onnx`)."""
    base = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = display_text(base, max_length=ARTIFACT_NAME_MAX)
    if name in {".", ".."}:
        raise ValueError("must name a file, not a directory")
    return name


def _node_label(raw: str) -> str:
    return display_text(raw, max_length=NODE_LABEL_MAX)


NodeLabel = Annotated[str, AfterValidator(_node_label)]


def node_display_name(label: str | None, hostname: str | None, node_id: str) -> str:
    """What a page calls a machine: its provider's label, else its hostname, else its id."""
    return label or hostname or node_id
