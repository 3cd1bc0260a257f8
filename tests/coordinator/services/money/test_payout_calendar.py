"""When payouts are due (SPEC §3.6), UTC: weekly on Mondays, monthly on the first business
day; pure date logic, no database."""

from datetime import date

import pytest

from gpu_share.coordinator.services.money.payout_calendar import (
    due_period,
    first_business_day,
    next_payout_day,
)
from gpu_share.protocol.payouts import PayoutSchedule

WEEKLY, MONTHLY = PayoutSchedule.WEEKLY, PayoutSchedule.MONTHLY


@pytest.mark.parametrize(
    ("year", "month", "first"),
    [
        (2026, 8, date(2026, 8, 3)),  # starts on a Saturday
        (2026, 11, date(2026, 11, 2)),  # on a Sunday
        (2026, 9, date(2026, 9, 1)),  # on a Tuesday
        (2027, 1, date(2027, 1, 1)),  # on a Friday (holidays are not known)
    ],
)
def test_the_first_business_day_skips_the_weekend(year: int, month: int, first: date) -> None:
    assert first_business_day(year, month) == first


def test_weekly_periods_are_iso_weeks_due_on_mondays_only() -> None:
    assert due_period(WEEKLY, date(2026, 12, 7)) == "2026-W50"
    assert due_period(WEEKLY, date(2027, 1, 4)) == "2027-W01"
    assert due_period(WEEKLY, date(2025, 12, 29)) == "2026-W01"  # ISO year of that Monday
    assert [due_period(WEEKLY, date(2026, 12, d)) for d in range(8, 14)] == [None] * 6


def test_monthly_periods_are_due_on_the_first_business_day_only() -> None:
    assert due_period(MONTHLY, date(2026, 8, 3)) == "2026-08"
    assert due_period(MONTHLY, date(2026, 8, 1)) is None
    assert due_period(MONTHLY, date(2026, 8, 4)) is None
    assert due_period(MONTHLY, date(2026, 9, 1)) == "2026-09"


def test_the_next_payout_day_is_today_on_a_payout_day() -> None:
    assert next_payout_day(WEEKLY, date(2026, 12, 7)) == date(2026, 12, 7)
    assert next_payout_day(WEEKLY, date(2026, 12, 8)) == date(2026, 12, 14)
    assert next_payout_day(WEEKLY, date(2026, 12, 13)) == date(2026, 12, 14)
    assert next_payout_day(MONTHLY, date(2026, 8, 2)) == date(2026, 8, 3)
    assert next_payout_day(MONTHLY, date(2026, 8, 3)) == date(2026, 8, 3)
    assert next_payout_day(MONTHLY, date(2026, 12, 9)) == date(2027, 1, 1)
