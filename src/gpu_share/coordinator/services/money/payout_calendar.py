"""When payouts are due (SPEC §3.6), in UTC: weekly on Mondays, monthly on the first
business day (Monday to Friday; public holidays are not known here).

A period has one name, and a batch is made once per name: "2026-W49" is the ISO week
of a weekly payout, "2026-12" the month of a monthly one. A period is due only on its
payout day, so a coordinator down for that whole day pays at the next payout day;
nothing is lost, the pending balance carries over.
"""

from datetime import UTC, date, datetime, time, timedelta

from gpu_share.protocol.payouts import PayoutSchedule


def first_business_day(year: int, month: int) -> date:
    day = date(year, month, 1)
    while day.weekday() >= 5:  # Saturday, Sunday
        day += timedelta(days=1)
    return day


def due_period(schedule: PayoutSchedule, today: date) -> str | None:
    """The period `schedule` pays on `today`, or None when today is not its payout day."""
    if schedule is PayoutSchedule.WEEKLY:
        if today.weekday() != 0:
            return None
        year, week, _ = today.isocalendar()
        return f"{year}-W{week:02d}"
    if today != first_business_day(today.year, today.month):
        return None
    return f"{today.year}-{today.month:02d}"


def next_payout_day(schedule: PayoutSchedule, today: date) -> date:
    """The first payout day of `schedule` on or after `today`."""
    if schedule is PayoutSchedule.WEEKLY:
        return today + timedelta(days=(7 - today.weekday()) % 7)
    this_month = first_business_day(today.year, today.month)
    if this_month >= today:
        return this_month
    year, month = (today.year + 1, 1) if today.month == 12 else (today.year, today.month + 1)
    return first_business_day(year, month)


def schedule_of_period(period: str) -> PayoutSchedule:
    return PayoutSchedule.WEEKLY if "-W" in period else PayoutSchedule.MONTHLY


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def week_start(now: datetime) -> datetime:
    today = now.astimezone(UTC).date()
    return midnight(today - timedelta(days=today.weekday()))


def month_start(now: datetime) -> datetime:
    return midnight(now.astimezone(UTC).date().replace(day=1))
