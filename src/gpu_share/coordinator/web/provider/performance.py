"""Provider dashboard: performance (the reliability score, its components and evidence,
and how it moved day by day) and each machine's weekly availability schedule."""

import math
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.services.nodes import schedules
from gpu_share.coordinator.services.providers import reliability, reliability_formula
from gpu_share.coordinator.web.pages import Browser, SignedProvider, form_of, text
from gpu_share.protocol.reliability import ReliabilityPoint
from gpu_share.protocol.schedules import Availability, Weekday, Window, known_timezones

router = APIRouter(prefix="/provider", include_in_schema=False)

DAYS = 30  # points on the charts: the end of each of the last 29 days, and now
MAX_WINDOWS = 28


@dataclass(frozen=True)
class Series:
    """A score's daily values for a sparkline, which draws from 0: shifted down by
    `floor` so the chart runs from `floor` to 1 and a move from 0.97 to 0.93 shows."""

    values: list[float]
    floor: float

    @property
    def top(self) -> float:
        return round(1 - self.floor, 6)


def chart(points: list[ReliabilityPoint]) -> dict[str, Series]:
    series = {}
    for name in ("score", "uptime", "completion", "stability"):
        values = [float(getattr(p, name)) for p in points]
        floor = min(0.8, math.floor(min(values, default=1.0) * 10) / 10)
        series[name] = Series([round(v - floor, 6) for v in values], floor)
    return series


@router.get("/performance")
async def performance(signed: SignedProvider) -> Response:
    browser, provider = signed
    now = browser.now()
    async with browser.replica.db.read() as session:
        history = await reliability.provider_history(session, provider.provider_id, now, DAYS)
    seen = {n.node.id: reliability_formula.history(n.current) for n in history.nodes}
    first = history.nodes[0].current if history.nodes else None  # the provider's start
    return browser.render(
        "provider/performance.html",
        history=history,
        seen=seen,
        provider_seen=reliability_formula.History.of_nodes(seen.values()),
        provider_start=reliability_formula.start_of(first),
        charts={n.node.id: chart(n.points) for n in history.nodes},
        provider_chart=chart(history.points),
        formula=reliability_formula,
    )


# ---- the schedule editor -------------------------------------------------------------


@dataclass
class ScheduleForm:
    """What the editor shows: the values as entered, and a message per field."""

    always: bool = True
    timezone: str = "UTC"
    rows: list[dict[str, Any]] = field(default_factory=list)  # days (list), start, end
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, availability: Availability) -> "ScheduleForm":
        rows = [
            {"days": [d.value for d in w.days], "start": w.start, "end": w.end}
            for w in availability.windows
        ]
        return cls(availability.always, availability.timezone, rows)

    def with_spare_row(self) -> "ScheduleForm":
        """The filled rows and an empty one to add a window in (no script needed)."""
        self.rows = ([r for r in self.rows if _filled(r)] + [_blank()])[:MAX_WINDOWS]
        return self


def _blank() -> dict[str, Any]:
    return {"days": [], "start": "", "end": ""}


def _filled(row: dict[str, Any]) -> bool:
    return bool(row["days"] or row["start"] or row["end"])


def read_schedule(form: FormData) -> tuple[ScheduleForm, Availability | None]:
    """The posted schedule, and the `Availability` it makes (None: it has errors)."""
    shown = text(form, "rows")
    count = max(1, min(MAX_WINDOWS, int(shown))) if shown.isdigit() else 1
    entered = ScheduleForm(
        always=text(form, "mode") != "schedule",
        timezone=text(form, "timezone") or "UTC",
        rows=[
            {
                "days": [d for d in form.getlist(f"window-{i}-days") if isinstance(d, str)],
                "start": text(form, f"window-{i}-start"),
                "end": text(form, f"window-{i}-end"),
            }
            for i in range(count)
        ],
    )
    if entered.always:
        return entered, Availability()
    if entered.timezone not in known_timezones():  # ZoneInfo("Europe") is an OSError
        entered.errors["timezone"] = "must be an IANA time zone such as Europe/Berlin or UTC"
    windows: list[Window] = []
    for i, row in enumerate(entered.rows):
        if not _filled(row):
            continue
        try:
            windows.append(Window.model_validate(row))
        except ValidationError as exc:
            for error in exc.errors():
                name = str(error["loc"][0]) if error["loc"] else "end"
                entered.errors.setdefault(f"window-{i}-{name}", _clean(error["msg"]))
    if not windows and not entered.errors:
        entered.errors["window-0-days"] = "add at least one window (days and hours), or choose 24/7"
    if entered.errors:
        return entered, None
    return entered, Availability(always=False, timezone=entered.timezone, windows=windows)


def _clean(message: str) -> str:
    message = message.removeprefix("Value error, ")
    if message.startswith("List should have at least 1 item"):
        return "choose at least one day"
    if message.startswith("Input should be"):
        return "choose days of the week"
    return message


def field_label(name: str) -> str:
    """`window-0-start` → "Window 1: from"."""
    if not name.startswith("window-"):
        return "Time zone" if name == "timezone" else name
    _, index, part = name.split("-", 2)
    return f"Window {int(index) + 1}: " + {"days": "days", "start": "from", "end": "until"}[part]


async def _editor(browser: Browser, provider_id: str, node_id: str) -> tuple[str, Availability]:
    async with browser.replica.db.read() as session:
        node = await schedules.own_node(session, provider_id, node_id)
        return node.label or node.hostname, schedules.availability_of(node)


def _render(
    browser: Browser, node_id: str, hostname: str, form: ScheduleForm, status: int = 200
) -> Response:
    return browser.render(
        "provider/schedule.html",
        status=status,
        node_id=node_id,
        hostname=hostname,
        form=form,
        weekdays=list(Weekday),
        timezones=known_timezones(),
        label=field_label,
    )


def _no_such_machine(browser: Browser) -> Response:
    return browser.render(
        "public/message.html",
        status=404,
        title="No such machine",
        message="You have no machine with that id.",
    )


@router.get("/machines/{node_id}/schedule")
async def schedule_page(node_id: str, signed: SignedProvider) -> Response:
    browser, provider = signed
    try:
        hostname, current = await _editor(browser, provider.provider_id, node_id)
    except NotFound:
        return _no_such_machine(browser)
    return _render(browser, node_id, hostname, ScheduleForm.of(current).with_spare_row())


@router.post("/machines/{node_id}/schedule")
async def save_schedule(node_id: str, signed: SignedProvider) -> Response:
    browser, provider = signed
    form = await form_of(browser)
    try:
        hostname, _current = await _editor(browser, provider.provider_id, node_id)
    except NotFound:
        return _no_such_machine(browser)
    entered, availability = read_schedule(form)
    if text(form, "add"):  # one more row, nothing saved yet
        entered.errors.clear()
        return _render(browser, node_id, hostname, entered.with_spare_row())
    if availability is None:
        return _render(browser, node_id, hostname, entered, status=422)
    async with browser.replica.db.write() as session:
        await schedules.set_availability(session, provider.provider_id, node_id, availability)
    saved = "open 24/7" if availability.always else "its weekly windows"
    return browser.redirect(
        f"/provider/machines/{node_id}/schedule", flash=f"Saved: {hostname} is now listed {saved}."
    )
