"""The days a money listing is asked for: defaults, bounds, and the field each 422 names."""

from datetime import date

import pytest

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.services.money.periods import days_asked

TODAY = date(2026, 12, 7)
NAMES = ("from", "to")


def test_the_last_30_days_by_default_and_what_was_asked_otherwise() -> None:
    assert days_asked(TODAY, None, None, names=NAMES) == (date(2026, 11, 8), TODAY)
    assert days_asked(TODAY, None, date(2026, 1, 10), names=NAMES) == (
        date(2025, 12, 12),
        date(2026, 1, 10),
    )
    assert days_asked(TODAY, None, date(2000, 1, 3), names=NAMES) == (
        date(2000, 1, 1),  # not before the earliest day
        date(2000, 1, 3),
    )


@pytest.mark.parametrize(
    ("first", "last", "fix"),
    [
        (None, date.max, "to: must be on or before 2027-12-08"),  # once a 500 (OverflowError)
        (None, date.min, "to: must be on or after 2000-01-01"),
        (date.min, date(2000, 1, 2), "from: must be on or after 2000-01-01"),
        (date(2026, 12, 2), date(2026, 12, 1), "from: must be on or before to (2026-12-01)"),
        (date(2025, 1, 1), date(2026, 12, 1), "from: the range can span at most 366 days"),
    ],
)
def test_a_day_out_of_bounds_names_the_field_to_fix(
    first: date | None, last: date, fix: str
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        days_asked(TODAY, first, last, names=NAMES)
    assert refused.value.message.startswith(fix)
    assert refused.value.details[0]["loc"] == [fix.split(":")[0]]
