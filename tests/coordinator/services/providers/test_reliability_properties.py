"""The reliability formula's promises (docs/reliability.md), for any history hypothesis
can think of: the score stays in [0, 1]; a provider-side failure never raises it; neither
downtime outside the windows nor a tenant-side failure changes it; and after a failure,
while nothing else happens, it never falls and the failure's mark only fades.

The components are checked before rounding (`uptime`, `completion`, `stability`), the
published score after (it is rounded to 6 decimals, which keeps every order)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.coordinator.services.nodes.presence import bucket_of
from gpu_share.coordinator.services.providers.reliability_formula import (
    NEUTRAL,
    TENANT_SIDE,
    WEIGHTS,
    BenchmarkScores,
    JobOutcome,
    NodeRecord,
    combine,
    completion,
    outcome,
    record_from_buckets,
    score,
    stability,
    uptime,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.schedules import Availability
from tests.coordinator.services.nodes.test_schedules import schedules

FIVE_MINUTES = timedelta(minutes=5)
TOLERANCE = 1e-12
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def raw(record: NodeRecord, now: datetime) -> float:
    """The score before rounding, from the components."""
    return (
        WEIGHTS["uptime"] * uptime(record, now)[0]
        + WEIGHTS["completion"] * completion(record, now)[0]
        + WEIGHTS["stability"] * stability(record, now)[0]
    )


def buckets(start: datetime, end: datetime) -> list[datetime]:
    found, at = [], bucket_of(start)
    while at < end:
        found.append(at)
        at += FIVE_MINUTES
    return found


class History:
    """A node's evidence up to `end`: presence but for some outages, jobs, benchmark runs."""

    def __init__(
        self,
        registered_at: datetime,
        availability: Availability,
        present: list[datetime],
        outcomes: list[JobOutcome],
        runs: list[BenchmarkScores],
    ) -> None:
        self.registered_at = registered_at
        self.availability = availability
        self.present = present
        self.outcomes = outcomes
        self.runs = runs

    def record(self, now: datetime, *, offline: bool = False) -> NodeRecord:
        """The record at `now`; `offline`: as if no heartbeat had ever come."""
        present = [] if offline else self.present
        return record_from_buckets(
            self.registered_at, self.availability, present, now, self.outcomes, self.runs
        )


moments = st.datetimes(datetime(2023, 1, 1), datetime(2026, 6, 1)).map(
    lambda d: d.replace(tzinfo=UTC)
)
availabilities = st.one_of(st.just(Availability()), schedules())


@st.composite
def histories(draw: st.DrawFn, days: int = 20) -> tuple[History, datetime]:
    """A node registered up to `days` days before `end`, and `end`."""
    end = draw(moments)
    registered_at = end - timedelta(seconds=draw(st.integers(0, days * 86400)))
    span = int((end - registered_at).total_seconds())

    def within() -> st.SearchStrategy[datetime]:
        return st.integers(0, span).map(lambda s: registered_at + timedelta(seconds=s))

    outages = draw(st.lists(st.tuples(within(), st.integers(1, 3 * 86400)), max_size=4))
    present = [
        b
        for b in buckets(registered_at, end)
        if not any(o <= b < o + timedelta(seconds=length) for o, length in outages)
    ]
    outcomes = draw(
        st.lists(st.builds(JobOutcome, within(), st.booleans(), st.integers(1, 5)), max_size=12)
    )
    scores = st.floats(0.05, 1.5).map(lambda s: {"gpu": s})
    runs = draw(st.lists(st.builds(BenchmarkScores, within(), scores), max_size=6))
    return History(registered_at, draw(availabilities), present, outcomes, runs), end


@PROPERTY
@given(histories(days=45), st.integers(0, 20 * 86400))
def test_the_score_and_its_components_stay_between_0_and_1(
    made: tuple[History, datetime], later: int
) -> None:
    history, end = made
    now = end + timedelta(seconds=later)
    published = score(history.record(now), now)
    for value in (published.score, published.uptime, published.completion, published.stability):
        assert 0 <= value <= 1
    assert 0 <= raw(history.record(now), now) <= 1


@PROPERTY
@given(histories(), st.data())
def test_a_provider_side_failure_never_raises_the_score(
    made: tuple[History, datetime], data: st.DataObject
) -> None:
    history, now = made
    before = history.record(now)
    span = int((now - history.registered_at).total_seconds())
    at = history.registered_at + timedelta(seconds=data.draw(st.integers(0, span)))
    after = replace(before, outcomes=[*before.outcomes, JobOutcome(at, provider_failure=True)])
    assert completion(after, now)[0] <= completion(before, now)[0] + TOLERANCE
    assert raw(after, now) <= raw(before, now) + TOLERANCE
    assert score(after, now).score <= score(before, now).score
    provider_after, provider_before = (
        combine([score(after, now)], now),
        combine([score(before, now)], now),
    )
    assert provider_after is not None and provider_before is not None
    assert provider_after.score <= provider_before.score


@PROPERTY
@given(histories(), st.lists(st.integers(0, 20 * 86400), max_size=300))
def test_presence_or_absence_outside_the_windows_changes_nothing(
    made: tuple[History, datetime], offsets: list[int]
) -> None:
    history, now = made
    start = now - timedelta(days=20)
    outside = [
        b
        for b in (bucket_of(start + timedelta(seconds=s)) for s in offsets)
        if not history.availability.open_at(b)
    ]
    in_windows = [b for b in history.present if history.availability.open_at(b)]
    base = score(history.record(now), now)
    with_more = record_from_buckets(
        history.registered_at,
        history.availability,
        [*history.present, *outside],
        now,
        history.outcomes,
        history.runs,
    )
    only_windows = record_from_buckets(
        history.registered_at,
        history.availability,
        in_windows,
        now,
        history.outcomes,
        history.runs,
    )
    assert score(with_more, now) == base
    assert score(only_windows, now) == base
    everywhere = buckets(history.registered_at, now)
    only_outside = [b for b in everywhere if not history.availability.open_at(b)]
    assert score(history.record(now, offline=True), now) == score(
        record_from_buckets(
            history.registered_at,
            history.availability,
            only_outside,
            now,
            history.outcomes,
            history.runs,
        ),
        now,
    )


@PROPERTY
@given(histories(), st.sampled_from(sorted(TENANT_SIDE)), st.data())
def test_a_tenant_side_failure_changes_nothing(
    made: tuple[History, datetime], code: ErrorCode, data: st.DataObject
) -> None:
    history, now = made
    span = int((now - history.registered_at).total_seconds())
    at = history.registered_at + timedelta(seconds=data.draw(st.integers(0, span)))
    assert outcome(at, completed=False, error_code=code.value) is None
    assert outcome(at, completed=False, error_code=None) is None
    lost = outcome(at, completed=False, error_code=ErrorCode.NODE_LOST.value)
    assert lost is not None and lost.provider_failure


@PROPERTY
@given(
    histories(days=12),
    st.lists(st.integers(0, 14 * 86400), min_size=2, max_size=6, unique=True),
)
def test_after_a_failure_the_score_never_falls_while_nothing_happens(
    made: tuple[History, datetime], offsets: list[int]
) -> None:
    """The failure is the last event; afterwards the node is online whenever it should be
    and nothing else happens. All of it stays inside the 30-day lookback."""
    history, failed_at = made
    history.outcomes.append(JobOutcome(failed_at, provider_failure=True))
    history.present = [b for b in history.present if b < failed_at] + buckets(
        failed_at, failed_at + timedelta(days=15)
    )
    succeeded = [*history.outcomes[:-1], JobOutcome(failed_at, provider_failure=False)]
    previous: list[float] | None = None
    for offset in sorted(offsets):
        now = failed_at + timedelta(seconds=offset)
        record = history.record(now)
        parts = [uptime(record, now)[0], completion(record, now)[0], stability(record, now)[0]]
        gap = raw(replace(record, outcomes=succeeded), now) - raw(record, now)  # the failure's mark
        assert gap >= -TOLERANCE
        current = [*parts, raw(record, now), score(record, now).score, -gap]
        if previous is not None:
            for before, after in zip(previous, current, strict=True):
                assert after >= before - TOLERANCE
        previous = current


def test_a_new_node_starts_at_the_neutral_value_and_earns_its_own() -> None:
    now = datetime(2025, 3, 3, 12, tzinfo=UTC)
    assert score(NodeRecord(now), now).score == NEUTRAL
    weeks_later = now + timedelta(days=21)
    online = record_from_buckets(now, Availability(), buckets(now, weeks_later), weeks_later)
    assert score(online, weeks_later).score > 0.99
    offline = NodeRecord(now)
    assert score(offline, weeks_later).uptime < 0.2  # three weeks of its windows, never there


def test_a_failure_fades_as_the_node_keeps_working() -> None:
    start = datetime(2025, 3, 3, 12, tzinfo=UTC)
    registered = start - timedelta(days=60)
    jobs = [JobOutcome(start - timedelta(hours=h), False) for h in range(1, 200, 4)]

    def completion_at(now: datetime, failures: int) -> float:
        lost = [JobOutcome(start, True)] * failures
        later = [JobOutcome(start + timedelta(hours=h), False) for h in range(1, 24 * 30, 4)]
        done = [j for j in later if j.at <= now]
        return completion(NodeRecord(registered, outcomes=jobs + lost + done), now)[0]

    day_after, two_weeks = start + timedelta(days=1), start + timedelta(days=14)
    first_mark = completion_at(day_after, 0) - completion_at(day_after, 3)
    later_mark = completion_at(two_weeks, 0) - completion_at(two_weeks, 3)
    assert later_mark < first_mark / 3
    assert completion_at(two_weeks, 3) > completion_at(day_after, 3)
