"""Weekly availability in a provider's own time zone (SPEC §3.4): 24/7, or windows."""

import re
from datetime import datetime
from enum import StrEnum
from typing import Self
from zoneinfo import ZoneInfo, available_timezones

from pydantic import BaseModel, Field, field_validator, model_validator

_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$|^24:00$")


class Weekday(StrEnum):
    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


class Window(BaseModel):
    """Every listed day, from `start` to `end` local time (`24:00` is the day's end)."""

    days: list[Weekday] = Field(min_length=1, max_length=7)
    start: str = Field(description="HH:MM, local time")
    end: str = Field(description="HH:MM after start; 24:00 for midnight")

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not _CLOCK.fullmatch(value):
            raise ValueError("must be a time of day as HH:MM, such as 08:30 (or 24:00 for an end)")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if minutes(self.end) <= minutes(self.start):
            raise ValueError(f"end {self.end} must be after start {self.start}")
        return self


def minutes(clock: str) -> int:
    hours, mins = clock.split(":")
    return int(hours) * 60 + int(mins)


# The zones a schedule may name: IANA's, without `localtime`, `posix/…` or `right/…`.
_ZONES = frozenset(
    zone for zone in available_timezones() if not zone.startswith(("posix/", "right/"))
) - {"localtime", "Factory"}


class Availability(BaseModel):
    """`always` (24/7, the default), or the weekly `windows` in `timezone`."""

    always: bool = True
    timezone: str = Field(default="UTC", max_length=64, description="An IANA zone: Europe/Berlin")
    windows: list[Window] = Field(default_factory=list, max_length=28)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if value not in _ZONES:
            raise ValueError("must be an IANA time zone such as Europe/Berlin or UTC")
        return value

    @model_validator(mode="after")
    def _windows_when_scheduled(self) -> Self:
        if not self.always and not self.windows:
            raise ValueError("a schedule needs at least one window (or set always: true)")
        return self

    def open_at(self, moment: datetime) -> bool:
        """Whether `moment` (aware) falls inside a window; daylight saving is the zone's."""
        if self.always:
            return True
        local = moment.astimezone(ZoneInfo(self.timezone))
        day = list(Weekday)[local.weekday()]
        now = local.hour * 60 + local.minute
        return any(
            day in window.days and minutes(window.start) <= now < minutes(window.end)
            for window in self.windows
        )


def known_timezones() -> list[str]:
    return sorted(available_timezones())
