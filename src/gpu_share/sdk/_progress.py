"""One rewritten line on stderr for uploads and waits; no dependency, off unless asked
or stderr is a terminal (so logs and tests never fill with carriage returns)."""

import sys
import time
from typing import TextIO

MiB = 1024 * 1024


def enabled(setting: bool | None, stream: TextIO | None = None) -> bool:
    if setting is not None:
        return setting
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressLine:
    """Rewrites one line at most ten times a second; `done` leaves it and moves on."""

    def __init__(self, stream: TextIO | None = None, min_interval: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        self.min_interval = min_interval
        self._last = 0.0
        self._width = 0

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        padding = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write(f"\r{text}{padding}")
        self.stream.flush()

    def done(self, text: str | None = None) -> None:
        if text is not None:
            self.show(text, force=True)
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0


def upload_line(name: str, sent: int, total: int) -> str:
    pct = 100 * sent // total if total else 100
    return f"uploading {name}: {sent / MiB:.1f}/{total / MiB:.1f} MiB ({pct}%)"
