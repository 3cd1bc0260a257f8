"""How pages show times, sizes, money and statuses: Jinja2 filters, one place."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpu_share.protocol.money import usdc_text


def when(moment: datetime | None) -> str:
    """An absolute UTC time a person can read; the exact one is in the title attribute."""
    if moment is None:
        return "—"
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    seconds = int((now - moment).total_seconds())
    if seconds < 5:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def size(count: int | None) -> str:
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def megabytes(mb: int | None) -> str:
    return size(mb * 1024 * 1024) if mb is not None else "—"


def usdc(micro: int | None) -> str:
    return "—" if micro is None else usdc_text(micro) + " USDC"


def label(value: Any) -> str:
    """An enum or snake_case value as words: info_requested → info requested."""
    return str(getattr(value, "value", value)).replace("_", " ")


FILTERS: dict[str, Callable[..., str]] = {
    "when": when,
    "ago": ago,
    "size": size,
    "megabytes": megabytes,
    "usdc": usdc,
    "label": label,
}
