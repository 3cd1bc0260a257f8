"""Availability schedules (SPEC §3.4): a provider sets each node's weekly windows in their
own time zone, only for their own nodes; `in_window` follows daylight saving, and the UTC
intervals the uptime score counts agree with it everywhere."""

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import httpx
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import in_window
from gpu_share.coordinator.services.nodes.schedules import open_intervals
from gpu_share.protocol.schedules import Availability, Weekday
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle, create_provider
from gpu_share.testing.simulated_agent import AgentFactory

BERLIN_EVENINGS = {
    "always": False,
    "timezone": "Europe/Berlin",
    "windows": [
        {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "18:00", "end": "24:00"},
        {"days": ["sat", "sun"], "start": "08:00", "end": "20:00"},
    ],
}
# 2024-03-31 and 2024-10-27 are the Sundays Berlin's clocks go forward and back.
SUNDAY_NIGHT = {
    "always": False,
    "timezone": "Europe/Berlin",
    "windows": [{"days": ["sun"], "start": "01:30", "end": "03:30"}],
}


def path(node_id: str | None) -> str:
    return f"/v1/provider/nodes/{node_id}/availability"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def row_with(availability: dict[str, Any] | None) -> NodeRow:
    return NodeRow(availability=availability)


async def stored(app: FastAPI, node_id: str | None) -> dict[str, Any] | None:
    async with app.state.replica.db.read() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        availability: dict[str, Any] | None = row.availability
        return availability


async def test_a_provider_sets_and_reads_back_a_nodes_weekly_windows(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    headers = {"Authorization": f"Bearer {provider.key}"}
    fresh = await client.get(path(agent.node_id), headers=headers)
    assert fresh.status_code == 200
    assert fresh.json() == {"always": True, "timezone": "UTC", "windows": []}

    saved = await client.put(path(agent.node_id), json=BERLIN_EVENINGS, headers=headers)
    assert saved.status_code == 200, saved.text
    assert saved.json() == BERLIN_EVENINGS
    assert (await client.get(path(agent.node_id), headers=headers)).json() == BERLIN_EVENINGS
    assert await stored(app, agent.node_id) == BERLIN_EVENINGS

    back = await client.put(path(agent.node_id), json={"always": True}, headers=headers)
    assert back.json()["always"] is True
    assert await stored(app, agent.node_id) is None  # 24/7 is no schedule at all


async def test_another_providers_node_is_not_found_and_left_unchanged(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    agent = await sim_agent()
    other = await create_provider(client, "Someone Else")
    headers = {"Authorization": f"Bearer {other.key}"}
    assert (await client.get(path(agent.node_id), headers=headers)).status_code == 404
    put = await client.put(path(agent.node_id), json=BERLIN_EVENINGS, headers=headers)
    assert put.status_code == 404 and put.json()["error"]["code"] == "NOT_FOUND"
    assert await stored(app, agent.node_id) is None
    unknown = "nod_" + "0" * 26
    owner = {"Authorization": f"Bearer {provider.key}"}
    assert (await client.get(path(unknown), headers=owner)).status_code == 404
    assert (await client.get(path("not-an-id"), headers=owner)).status_code == 422
    assert (await client.get(path(agent.node_id), headers=tenant.headers)).status_code == 403
    assert (await client.get(path(agent.node_id))).status_code == 401


async def test_invalid_schedules_are_refused_with_what_to_fix(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    headers = {"Authorization": f"Bearer {provider.key}"}
    window = {"days": ["mon"], "start": "09:00", "end": "17:00"}
    cases = [
        ({**BERLIN_EVENINGS, "timezone": "Mars/Olympus"}, "IANA time zone"),
        ({"always": False, "timezone": "UTC", "windows": []}, "at least one window"),
        ({"always": False, "windows": [{**window, "start": "17:00", "end": "09:00"}]}, "after"),
        ({"always": False, "windows": [{**window, "start": "25:00"}]}, "HH:MM"),
        ({"always": False, "windows": [{**window, "days": []}]}, "at least 1"),
        ({"always": False, "windows": [{**window, "days": ["someday"]}]}, "days"),
        ({"always": False, "windows": [window] * 29}, "at most 28"),
    ]
    for body, said in cases:
        answer = await client.put(path(agent.node_id), json=body, headers=headers)
        assert answer.status_code == 422, body
        assert said in answer.text, answer.text
    assert await stored(app, agent.node_id) is None


async def test_a_node_outside_its_windows_is_not_offered(
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent(verified=True)
    await agent.heartbeat()
    headers = {"Authorization": f"Bearer {provider.key}"}
    offered = await client.get("/v1/offers", headers=tenant.headers)
    assert [o["node_id"] for o in offered.json()] == [agent.node_id]
    today = list(Weekday)[clock.now().weekday()]
    closed_today = {
        "always": False,
        "timezone": "UTC",
        "windows": [
            {"days": [d.value for d in Weekday if d != today], "start": "00:00", "end": "24:00"}
        ],
    }
    assert (await client.put(path(agent.node_id), json=closed_today, headers=headers)).is_success
    assert (await client.get("/v1/offers", headers=tenant.headers)).json() == []


def test_a_node_without_a_schedule_is_open_around_the_clock() -> None:
    for moment in (at("2024-03-31T01:15:00"), at("2024-12-25T23:59:00")):
        assert in_window(row_with(None), moment)


def test_a_berlin_window_follows_the_clock_change_in_spring() -> None:
    row = row_with(SUNDAY_NIGHT)
    # Clocks jump from 02:00 to 03:00 local (01:00 UTC): 01:30-03:30 lasts one real hour.
    assert not in_window(row, at("2024-03-31T00:29:00"))  # 01:29 CET
    assert in_window(row, at("2024-03-31T00:30:00"))  # 01:30 CET
    assert in_window(row, at("2024-03-31T01:29:00"))  # 03:29 CEST
    assert not in_window(row, at("2024-03-31T01:30:00"))  # 03:30 CEST
    night = open_intervals(
        Availability.model_validate(SUNDAY_NIGHT),
        at("2024-03-30T00:00:00"),
        at("2024-04-01T00:00:00"),
    )
    assert night == [(at("2024-03-31T00:30:00"), at("2024-03-31T01:30:00"))]


def test_a_berlin_window_follows_the_clock_change_in_autumn() -> None:
    row = row_with(SUNDAY_NIGHT)
    # Clocks fall back from 03:00 to 02:00 local (01:00 UTC): the window lasts three hours.
    assert in_window(row, at("2024-10-26T23:30:00"))  # 01:30 CEST
    assert in_window(row, at("2024-10-27T01:30:00"))  # 02:30 CET, the second time
    assert not in_window(row, at("2024-10-27T02:30:00"))  # 03:30 CET
    night = open_intervals(
        Availability.model_validate(SUNDAY_NIGHT),
        at("2024-10-26T00:00:00"),
        at("2024-10-28T00:00:00"),
    )
    assert night == [(at("2024-10-26T23:30:00"), at("2024-10-27T02:30:00"))]


def test_a_weekday_window_moves_in_utc_with_summer_time() -> None:
    row = row_with(BERLIN_EVENINGS)
    assert not in_window(row, at("2024-01-15T16:59:00"))  # Monday 17:59 CET
    assert in_window(row, at("2024-01-15T17:00:00"))  # Monday 18:00 CET
    assert not in_window(row, at("2024-07-15T15:59:00"))  # Monday 17:59 CEST
    assert in_window(row, at("2024-07-15T16:00:00"))  # Monday 18:00 CEST
    assert in_window(row, at("2024-07-15T21:59:00"))  # Monday 23:59 CEST
    assert not in_window(row, at("2024-07-15T22:00:00"))  # Tuesday 00:00 CEST


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
clock_times = st.integers(0, 24 * 60 - 1).map(lambda m: f"{m // 60:02d}:{m % 60:02d}")


@st.composite
def schedules(draw: st.DrawFn) -> Availability:
    windows = []
    for _ in range(draw(st.integers(1, 4))):
        start = draw(clock_times)
        length = draw(st.integers(1, 24 * 60 - int(start[:2]) * 60 - int(start[3:])))
        end_minutes = int(start[:2]) * 60 + int(start[3:]) + length
        days = draw(st.lists(st.sampled_from(list(Weekday)), min_size=1, max_size=7, unique=True))
        windows.append(
            {"days": days, "start": start, "end": f"{end_minutes // 60:02d}:{end_minutes % 60:02d}"}
        )
    return Availability.model_validate(
        {"always": False, "timezone": draw(st.sampled_from(ZONES)), "windows": windows}
    )


@settings(max_examples=150, deadline=None)
@given(
    availability=schedules(),
    start=st.datetimes(datetime(2023, 1, 1), datetime(2026, 12, 1)).map(
        lambda d: d.replace(tzinfo=UTC)
    ),
    probes=st.lists(st.integers(0, 9 * 24 * 3600 - 1), min_size=1, max_size=40),
)
def test_the_intervals_agree_with_open_at_at_every_moment(
    availability: Availability, start: datetime, probes: list[int]
) -> None:
    end = start + timedelta(days=9)
    intervals = open_intervals(availability, start, end)
    assert intervals == sorted(intervals)
    assert all(a < b for a, b in intervals)
    assert all(b1 < a2 for (_, b1), (a2, _) in pairwise(intervals))  # disjoint, merged
    for offset in probes:
        moment = start + timedelta(seconds=offset)
        inside = any(a <= moment < b for a, b in intervals)
        assert inside == availability.open_at(moment), moment
