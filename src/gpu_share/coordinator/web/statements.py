"""What the two statement pages share: which month a visitor asked for. A month that is
not YYYY-MM, or has not started, is said beside the month field and the page shows the
default month meanwhile: the last complete one."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.services.money.statements import month_of


@dataclass(frozen=True)
class AskedMonth:
    month: str  # the month to show
    entered: str  # what was typed
    error: str | None


def last_month(now: datetime) -> str:
    first = now.astimezone(UTC).date().replace(day=1)
    return (first - timedelta(days=1)).strftime("%Y-%m")


def asked_month(value: str | None, now: datetime) -> AskedMonth:
    entered = (value or "").strip()
    if not entered:
        return AskedMonth(last_month(now), last_month(now), None)
    try:
        month_of(entered, now)
    except ValidationFailed as exc:
        return AskedMonth(last_month(now), entered, exc.message.removeprefix("month: "))
    return AskedMonth(entered, entered, None)
