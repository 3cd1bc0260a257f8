"""The UTC days a money listing is asked for (a tenant's usage, a provider's earnings):
the last 30 by default, at most a year, within the days a charge can have.

One rule for both, with each API's own names for its two ends. The bounds also keep the
date arithmetic in range: a day one past `date.max`, or 29 before `date.min`, is an
OverflowError, which a fuzzer's `to=9999-12-31` turned into a 500."""

from datetime import date, timedelta

from gpu_share.coordinator.core.errors import field_error

DEFAULT_DAYS = 30
MAX_DAYS = 366
EARLIEST = date(2000, 1, 1)  # before any charge


def days_asked(
    today: date, first: date | None, last: date | None, *, names: tuple[str, str]
) -> tuple[date, date]:
    """The inclusive days from `first` to `last` (`names`: their fields, for the 422 that
    says which to fix)."""
    first_name, last_name = names
    last = last or today
    latest = today + timedelta(days=MAX_DAYS)
    if last > latest:
        raise field_error(last_name, f"must be on or before {latest.isoformat()}")
    if last < EARLIEST:
        raise field_error(last_name, f"must be on or after {EARLIEST.isoformat()}")
    first = first or max(EARLIEST, last - timedelta(days=DEFAULT_DAYS - 1))
    if first < EARLIEST:
        raise field_error(first_name, f"must be on or after {EARLIEST.isoformat()}")
    if first > last:
        raise field_error(first_name, f"must be on or before {last_name} ({last.isoformat()})")
    if (last - first).days >= MAX_DAYS:
        raise field_error(first_name, f"the range can span at most {MAX_DAYS} days; narrow it")
    return first, last
