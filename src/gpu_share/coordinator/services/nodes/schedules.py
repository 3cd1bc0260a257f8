"""A node's weekly availability (SPEC §3.4): what its provider declared, whether a moment is
inside it, and the declared windows as UTC intervals.

Outside its windows a node is not listed and gets no new work; what already runs
finishes. `Availability.open_at` is the one definition of "inside"; `open_intervals`
gives the same answer for a whole stretch of time at once (the uptime part of the
reliability score counts only window time, docs/reliability.md), and a test holds the
two to each other across daylight-saving changes.
"""

from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.protocol.schedules import Availability, Weekday, minutes

Interval = tuple[datetime, datetime]  # [start, end) in UTC

_WEEK = list(Weekday)
_PROBE = timedelta(hours=1)  # no zone changes its offset twice within an hour


def availability_of(row: NodeRow) -> Availability:
    """The node's declared availability; a node without one is open 24/7."""
    return parse_availability(row.availability)


def parse_availability(stored: dict[str, Any] | None) -> Availability:
    return Availability() if stored is None else Availability.model_validate(stored)


async def own_node(session: AsyncSession, provider_id: str, node_id: str) -> NodeRow:
    row = await session.get(NodeRow, node_id)
    if row is None or row.provider_id != provider_id:
        raise NotFound(f"no node {node_id} of yours")  # another's node is not even confirmed
    return row


async def get_availability(session: AsyncSession, provider_id: str, node_id: str) -> Availability:
    return availability_of(await own_node(session, provider_id, node_id))


async def set_availability(
    session: AsyncSession, provider_id: str, node_id: str, availability: Availability
) -> Availability:
    """Replace the node's schedule; 24/7 is stored as no schedule at all.

    It applies from now: placement and listing read it on their next look, and work
    already running is left to finish.
    """
    row = await own_node(session, provider_id, node_id)
    row.availability = None if availability.always else availability.model_dump(mode="json")
    await session.flush()
    return availability_of(row)


def open_intervals(availability: Availability, start: datetime, end: datetime) -> list[Interval]:
    """The moments in [start, end) that `availability.open_at` calls open, as sorted,
    disjoint UTC intervals.

    Between two changes of the zone's UTC offset, local wall time is UTC plus a constant,
    so each window on each local day is one interval; a daylight-saving change splits the
    stretch there (a window on the day clocks go forward is an hour shorter, on the day
    they go back an hour longer, as open_at sees it).
    """
    if end <= start:
        return []
    if availability.always:
        return [(start, end)]
    zone = ZoneInfo(availability.timezone)
    found: list[Interval] = []
    for seg_start, seg_end, offset in _offset_segments(zone, start, end):
        wall_start = (seg_start + offset).replace(tzinfo=None)
        wall_end = (seg_end + offset).replace(tzinfo=None)
        day: date = wall_start.date()
        while day <= wall_end.date():
            weekday = _WEEK[day.weekday()]
            midnight = datetime.combine(day, time())
            for window in availability.windows:
                if weekday not in window.days:
                    continue
                lo = max(midnight + timedelta(minutes=minutes(window.start)), wall_start)
                hi = min(midnight + timedelta(minutes=minutes(window.end)), wall_end)
                if lo < hi:
                    found.append(
                        ((lo - offset).replace(tzinfo=UTC), (hi - offset).replace(tzinfo=UTC))
                    )
            day += timedelta(days=1)
    return _merged(found)


def _offset_segments(
    zone: ZoneInfo, start: datetime, end: datetime
) -> list[tuple[datetime, datetime, timedelta]]:
    """[start, end) cut where the zone's UTC offset changes, with each piece's offset."""

    def offset_at(moment: datetime) -> timedelta:
        value = moment.astimezone(zone).utcoffset()
        return value if value is not None else timedelta(0)

    segments: list[tuple[datetime, datetime, timedelta]] = []
    piece_start, offset = start, offset_at(start)
    probe = start
    while probe < end:
        step = min(probe + _PROBE, end)
        if offset_at(step) != offset:
            # The change lies in (probe, step]; offsets change on whole seconds.
            lo, hi = int(probe.timestamp()), int(step.timestamp())
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset_at(datetime.fromtimestamp(mid, UTC)) == offset:
                    lo = mid
                else:
                    hi = mid
            change = datetime.fromtimestamp(hi, UTC)
            segments.append((piece_start, change, offset))
            piece_start, offset = change, offset_at(change)
        probe = step
    segments.append((piece_start, end, offset))
    return [(a, b, off) for a, b, off in segments if a < b]


def _merged(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged
