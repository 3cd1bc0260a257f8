"""Money by day as a bar chart the server draws: SVG geometry for `_chart.html`, with a
y axis in USDC at round steps, the days it covers labelled, and the figures again as a
table for those who would rather read (or cannot see) it. No script and no style
attribute (the pages' policy allows neither inline): positions and sizes are SVG
attributes, colours come from app.css.

Live telemetry stays a sparkline drawn by app.js; this is for figures that change only
when the page is loaded again (the tenant's spending, the provider's earnings).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from gpu_share.protocol.money import usdc_text

WIDTH = 720  # the viewBox; the SVG scales to its box, its text with it
HEIGHT = 220
LEFT = 96  # room for the y axis' labels
RIGHT = 8
TOP = 26  # room for the unit above the y axis
BOTTOM = 30  # room for the days
STEPS = (1, 2, 5)  # a tick is 1, 2 or 5 × 10ⁿ micro-USDC
TICKS = 4  # intervals on the y axis


@dataclass(frozen=True)
class Bar:
    day: date
    micro: int
    x: float
    y: float
    width: float
    height: float

    @property
    def text(self) -> str:
        return f"{self.day.strftime('%d %b %Y')}: {usdc_text(self.micro)} USDC"


@dataclass(frozen=True)
class Tick:
    y: float
    text: str


@dataclass(frozen=True)
class DayLabel:
    x: float
    text: str
    anchor: str  # text-anchor: start, middle or end


@dataclass(frozen=True)
class DailyBars:
    """What `_chart.html` draws: bars, the y axis' ticks, the days' labels, the frame."""

    title: str  # what is counted, in words: "Spent per day"
    start: date
    end: date
    bars: list[Bar]
    ticks: list[Tick]
    days: list[DayLabel]
    total_micro: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def any(self) -> bool:
        return self.total_micro != 0

    @property
    def summary(self) -> str:
        """The chart in one sentence (its accessible name)."""
        best = max(self.bars, key=lambda bar: bar.micro, default=None)
        most = f"; the most {best.text}" if best is not None and best.micro > 0 else ""
        return (
            f"{self.title} in USDC, {self.start.strftime('%d %b %Y')} to "
            f"{self.end.strftime('%d %b %Y')} (UTC): {usdc_text(self.total_micro)} USDC in all"
            f"{most}"
        )


def nice_step(top_micro: int, ticks: int = TICKS) -> int:
    """The smallest 1, 2 or 5 × 10ⁿ micro-USDC step whose `ticks` steps reach `top_micro`."""
    magnitude = 1
    while True:
        for step in STEPS:
            if step * magnitude * ticks >= top_micro:
                return step * magnitude
        magnitude *= 10


def daily_bars(title: str, days: Sequence[tuple[date, int]]) -> DailyBars:
    """One bar per day, oldest first; `days` holds every day of the range, 0 included."""
    plot_width = WIDTH - RIGHT - LEFT
    plot_height = HEIGHT - BOTTOM - TOP
    step = nice_step(max((max(micro, 0) for _, micro in days), default=0) or 1)
    top = step * TICKS
    slot = plot_width / max(len(days), 1)
    gap = min(slot * 0.2, 4.0)
    bars = []
    for index, (day, micro) in enumerate(days):
        height = plot_height * max(micro, 0) / top
        if micro > 0:
            height = max(height, 1.0)  # a day with a charge always shows
        bars.append(
            Bar(
                day=day,
                micro=micro,
                x=round(LEFT + index * slot + gap / 2, 2),
                y=round(TOP + plot_height - height, 2),
                width=round(slot - gap, 2),
                height=round(height, 2),
            )
        )
    ticks = [
        Tick(y=round(TOP + plot_height - plot_height * i / TICKS, 2), text=usdc_text(step * i))
        for i in range(TICKS + 1)
    ]
    labels: list[DayLabel] = []
    if days:
        first, last = days[0][0], days[-1][0]
        labels.append(DayLabel(LEFT, first.strftime("%d %b"), "start"))
        if len(days) > 2:
            middle = len(days) // 2
            labels.append(
                DayLabel(
                    round(LEFT + (middle + 0.5) * slot, 2),
                    days[middle][0].strftime("%d %b"),
                    "middle",
                )
            )
        if last != first:
            labels.append(DayLabel(WIDTH - RIGHT, last.strftime("%d %b"), "end"))
    return DailyBars(
        title=title,
        start=days[0][0] if days else date.min,
        end=days[-1][0] if days else date.min,
        bars=bars,
        ticks=ticks,
        days=labels,
        total_micro=sum(micro for _, micro in days),
    )
