"""The reliability score's formula (SPEC §3.7), as docs/reliability.md writes it down:
pure functions of plain records, no database.

Three components, each `1 - (bad + probation) / (evidence + cushion)`:

- uptime: window hours without a heartbeat, of the declared window hours (time outside
  the windows is not evidence at all);
- completion: jobs and sessions lost for provider-side causes (`PROVIDER_SIDE`), of those
  completed or so lost (tenant-side failures are not evidence at all);
- stability: how far benchmark runs dropped below the node's first run, per run.

Every piece of evidence is dated to the start of its UTC hour and weighs
`0.5 ** (age / HALF_LIFE)`; nothing older than `LOOKBACK` counts. The cushion is clean
evidence that never ages, the probation a bad share placed at registration that ages like
evidence: a new node starts at its `start` (its provider's published score when it
registered, `NEUTRAL` when the provider had none), and with nothing happening a score never
falls.
`services/providers/reliability.py` reads the records from the database and publishes the scores.
"""

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from gpu_share.coordinator.services.nodes.presence import BUCKET_SEC, bucket_of
from gpu_share.coordinator.services.nodes.schedules import Interval, open_intervals
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.reliability import (
    CompletionEvidence,
    Reliability,
    ReliabilityPoint,
    StabilityEvidence,
    UptimeEvidence,
)
from gpu_share.protocol.schedules import Availability

HALF_LIFE = timedelta(days=7)
LOOKBACK = timedelta(days=30)
STEP_SEC = 3600  # evidence is dated to the start of its UTC hour
NEUTRAL = 0.9  # a new node's score and each component's, when its provider has no score
WEIGHTS = {"uptime": 0.4, "completion": 0.4, "stability": 0.2}
UPTIME_CUSHION_HOURS = 24.0
COMPLETION_CUSHION_JOBS = 5.0
STABILITY_CUSHION_RUNS = 2.0
DROP_TOLERANCE = 0.05  # a benchmark this much below the first run is noise, not a drop

# Why a job or session ended badly, sorted once. Only PROVIDER_SIDE counts against a
# node: its machine or agent went away or broke. TENANT_SIDE is the tenant's model,
# inputs, limits or choice (a runtime error or out-of-memory cannot be told apart from a
# broken model). The rest are answers to API calls, never a job's end. A test checks
# that every ErrorCode is in exactly one.
PROVIDER_SIDE = frozenset(
    {
        ErrorCode.LEASE_EXPIRED,
        ErrorCode.NODE_LOST,
        ErrorCode.AGENT_ERROR,
        ErrorCode.NODE_QUARANTINED,  # caught returning wrong results (docs/trust.md)
    }
)
TENANT_SIDE = frozenset(
    {
        ErrorCode.INVALID_MODEL,
        ErrorCode.INVALID_INPUTS,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.DOWNLOAD_FAILED,
        ErrorCode.URL_FORBIDDEN,
        ErrorCode.CHECKSUM_MISMATCH,
        ErrorCode.TIMEOUT,
        ErrorCode.CANCELED,
        ErrorCode.QUOTA_EXCEEDED,
        ErrorCode.RESOURCE_LIMIT,
        ErrorCode.RUNTIME_ERROR,
        ErrorCode.OUT_OF_MEMORY,
        ErrorCode.OUTPUT_UPLOAD_FAILED,
        ErrorCode.IDLE_TIMEOUT,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.INTERNAL,  # the platform's own fault, not the provider's
    }
)
NOT_JOB_OUTCOMES = frozenset(ErrorCode) - PROVIDER_SIDE - TENANT_SIDE

_BUCKETS_PER_STEP = STEP_SEC // BUCKET_SEC
_BUCKET_HOURS = BUCKET_SEC / 3600
_HALF_LIFE_SEC = HALF_LIFE.total_seconds()


@dataclass(frozen=True)
class JobOutcome:
    """`count` jobs or sessions that ended at `at`: completed, or lost provider-side."""

    at: datetime
    provider_failure: bool
    count: int = 1


def outcome(
    at: datetime, completed: bool, error_code: str | None, count: int = 1
) -> JobOutcome | None:
    """A job's or session's end as evidence: completed, lost for a provider-side cause,
    or (None) not evidence at all: a tenant-side failure, a cancel, a timeout."""
    if completed:
        return JobOutcome(at, False, count)
    if error_code in PROVIDER_SIDE:
        return JobOutcome(at, True, count)
    return None


@dataclass(frozen=True)
class BenchmarkScores:
    """One benchmark run: the score per GPU uuid (a CPU node's: under "node")."""

    at: datetime
    scores: Mapping[str, float]


@dataclass(frozen=True)
class NodeRecord:
    """What a node's score is made of. `online` maps each UTC hour (its start) to the
    number of ended 5-minute buckets in it that were inside the windows and had a heartbeat.
    `start` is the score it started from (`starting_score`)."""

    registered_at: datetime
    availability: Availability = field(default_factory=Availability)
    online: Mapping[datetime, int] = field(default_factory=dict)
    outcomes: Sequence[JobOutcome] = ()
    benchmarks: Sequence[BenchmarkScores] = ()
    start: float = NEUTRAL

    @cached_property
    def online_steps(self) -> dict[int, int]:
        return {step_of(at): n for at, n in self.online.items()}


def step_of(moment: datetime) -> int:
    return int(moment.timestamp()) // STEP_SEC


def step_start(step: int) -> datetime:
    return datetime.fromtimestamp(step * STEP_SEC, UTC)


def weight(age_sec: float) -> float:
    return float(0.5 ** (max(0.0, age_sec) / _HALF_LIFE_SEC))


def lookback_start(now: datetime) -> datetime:
    return step_start(step_of(now)) - LOOKBACK


def record_from_buckets(
    registered_at: datetime,
    availability: Availability,
    present: Iterable[datetime],
    now: datetime,
    outcomes: Sequence[JobOutcome] = (),
    benchmarks: Sequence[BenchmarkScores] = (),
) -> NodeRecord:
    """A record from the 5-minute buckets (their starts) in which the node sent a
    heartbeat: those inside the windows and ended by `now`, counted per hour."""
    ended = bucket_of(now)
    online: defaultdict[datetime, int] = defaultdict(int)
    for bucket in set(present):
        if bucket < ended and availability.open_at(bucket):
            online[step_start(step_of(bucket))] += 1
    return NodeRecord(registered_at, availability, dict(online), outcomes, benchmarks)


def window_buckets(
    intervals: Iterable[Interval], since: datetime, until: datetime
) -> dict[int, int]:
    """Per hour, how many 5-minute buckets in [since, until) start inside the intervals."""
    counts: defaultdict[int, int] = defaultdict(int)
    for lo, hi in intervals:
        first = math.ceil(max(lo, since).timestamp() / BUCKET_SEC)
        end = math.ceil(min(hi, until).timestamp() / BUCKET_SEC)
        while first < end:
            step = first // _BUCKETS_PER_STEP
            taken = min(end, (step + 1) * _BUCKETS_PER_STEP) - first
            counts[step] += taken
            first += taken
    return counts


def _observed(record: NodeRecord, now: datetime) -> tuple[datetime, datetime]:
    """The window time that counts: from registration or the lookback, to the last ended bucket."""
    return max(bucket_of(record.registered_at), lookback_start(now)), bucket_of(now)


def starting_score(provider_score: float | None) -> float:
    """Where a new node starts: at its provider's published score, so a provider's record
    follows it onto new machines (a fresh node id resets nothing); `NEUTRAL` for a
    provider without one (its first machine)."""
    if provider_score is None or not math.isfinite(provider_score):
        return NEUTRAL
    return min(1.0, max(0.0, provider_score))


def _component(
    bad: float, evidence: float, cushion: float, record: NodeRecord, now: datetime
) -> float:
    age = (now - record.registered_at).total_seconds()
    probation = cushion * (1 - record.start) * weight(age)
    return min(1.0, max(0.0, 1 - (bad + probation) / (evidence + cushion)))


def uptime(
    record: NodeRecord, now: datetime, expected: Mapping[int, int] | None = None
) -> tuple[float, UptimeEvidence]:
    """`expected` (window buckets per hour, `window_buckets`) may be given for a longer
    stretch, to be reused across evaluation times; only [since, until) is read."""
    since, until = _observed(record, now)
    if expected is None:
        expected = window_buckets(open_intervals(record.availability, since, until), since, until)
    online = record.online_steps
    first, last = step_of(since), step_of(until - timedelta(microseconds=1))
    hours = online_hours = weighted = offline = 0.0
    w, older = weight(now.timestamp() - last * STEP_SEC), weight(STEP_SEC)
    for step in range(last, first - 1, -1) if since < until else ():
        if due := expected.get(step, 0):
            up = min(due, online.get(step, 0))
            hours += due * _BUCKET_HOURS
            online_hours += up * _BUCKET_HOURS
            weighted += w * due * _BUCKET_HOURS
            offline += w * (due - up) * _BUCKET_HOURS
        w *= older  # an hour further back
    value = _component(offline, weighted, UPTIME_CUSHION_HOURS, record, now)
    return value, UptimeEvidence(
        hours_in_windows=round(hours, 3),
        hours_online=round(online_hours, 3),
        weighted_hours=round(weighted, 3),
        weighted_offline_hours=round(offline, 3),
    )


def _counted(at: datetime, now: datetime) -> bool:
    return lookback_start(now) <= at <= now


def _age(at: datetime, now: datetime) -> float:
    return (now - step_start(step_of(at))).total_seconds()


def completion(record: NodeRecord, now: datetime) -> tuple[float, CompletionEvidence]:
    jobs = failures = 0
    weighted = weighted_failures = 0.0
    last_failure: datetime | None = None
    for ended in record.outcomes:
        if not _counted(ended.at, now):
            continue
        w = weight(_age(ended.at, now)) * ended.count
        jobs += ended.count
        weighted += w
        if ended.provider_failure:
            failures += ended.count
            weighted_failures += w
            last_failure = max(last_failure or ended.at, ended.at)
    value = _component(weighted_failures, weighted, COMPLETION_CUSHION_JOBS, record, now)
    return value, CompletionEvidence(
        jobs_counted=jobs,
        jobs_completed=jobs - failures,
        provider_failures=failures,
        weighted_jobs=round(weighted, 3),
        weighted_failures=round(weighted_failures, 3),
        last_failure_at=last_failure,
    )


def drop(score: float, baseline: float) -> float:
    """How far a run fell below the first, beyond the tolerance, as a fraction in [0, 1]."""
    fell = (baseline - score) / baseline - DROP_TOLERANCE
    return min(1.0, max(0.0, fell / (1 - DROP_TOLERANCE)))


def stability(record: NodeRecord, now: datetime) -> tuple[float, StabilityEvidence]:
    runs = sorted((r for r in record.benchmarks if r.at <= now), key=lambda r: r.at)
    baseline: dict[str, float] = {}
    counted = 0
    weighted = weighted_drop = 0.0
    drops: list[float] = []
    for run in runs:
        # Measured against the baselines earlier runs set: the run that sets a GPU's
        # baseline is no evidence of its stability (it would count as one clean run).
        shared = [drop(s, baseline[k]) for k, s in run.scores.items() if k in baseline]
        for key, value in run.scores.items():
            if value > 0:
                baseline.setdefault(key, value)
        if not shared or not _counted(run.at, now):
            continue
        fell = sum(shared) / len(shared)
        w = weight(_age(run.at, now))
        counted += 1
        weighted += w
        weighted_drop += w * fell
        drops.append(fell)
    value = _component(weighted_drop, weighted, STABILITY_CUSHION_RUNS, record, now)
    return value, StabilityEvidence(
        runs_counted=counted,
        baseline_at=runs[0].at if runs and baseline else None,
        latest_drop=round(drops[-1], 4) if drops else None,
        worst_drop=round(max(drops), 4) if drops else None,
        weighted_runs=round(weighted, 3),
        weighted_drop=round(weighted_drop, 3),
    )


def score(
    record: NodeRecord, now: datetime, expected: Mapping[int, int] | None = None
) -> Reliability:
    """A node's reliability at `now` from its record (evidence after `now` is ignored)."""
    up, up_evidence = uptime(record, now, expected)
    done, done_evidence = completion(record, now)
    steady, steady_evidence = stability(record, now)
    total = WEIGHTS["uptime"] * up + WEIGHTS["completion"] * done + WEIGHTS["stability"] * steady
    return Reliability(
        score=round(total, 6),
        uptime=round(up, 6),
        completion=round(done, 6),
        stability=round(steady, 6),
        uptime_evidence=up_evidence,
        completion_evidence=done_evidence,
        stability_evidence=steady_evidence,
        half_life_days=HALF_LIFE / timedelta(days=1),
        lookback_days=LOOKBACK / timedelta(days=1),
        computed_at=now,
        start=round(record.start, 6),
    )


def combine(parts: Sequence[Reliability], now: datetime) -> Reliability | None:
    """A provider's score: its nodes' averaged, each weighing its decayed window hours
    plus the uptime cushion (so a node that just arrived counts too). None: no node."""
    if not parts:
        return None
    weights = [p.uptime_evidence.weighted_hours + UPTIME_CUSHION_HOURS for p in parts]
    total = sum(weights)

    def mean(name: str) -> float:
        value = sum(w * float(getattr(p, name)) for w, p in zip(weights, parts, strict=True))
        return round(min(1.0, max(0.0, value / total)), 6)

    def summed(evidence: str, name: str) -> Any:
        return sum(getattr(getattr(p, evidence), name) for p in parts)

    def extreme(evidence: str, name: str, pick: Any) -> Any:
        values = [v for p in parts if (v := getattr(getattr(p, evidence), name)) is not None]
        return pick(values) if values else None

    return Reliability(
        score=mean("score"),
        uptime=mean("uptime"),
        completion=mean("completion"),
        stability=mean("stability"),
        uptime_evidence=UptimeEvidence(
            **{n: round(summed("uptime_evidence", n), 3) for n in UptimeEvidence.model_fields}
        ),
        completion_evidence=CompletionEvidence(
            jobs_counted=summed("completion_evidence", "jobs_counted"),
            jobs_completed=summed("completion_evidence", "jobs_completed"),
            provider_failures=summed("completion_evidence", "provider_failures"),
            weighted_jobs=round(summed("completion_evidence", "weighted_jobs"), 3),
            weighted_failures=round(summed("completion_evidence", "weighted_failures"), 3),
            last_failure_at=extreme("completion_evidence", "last_failure_at", max),
        ),
        stability_evidence=StabilityEvidence(
            runs_counted=summed("stability_evidence", "runs_counted"),
            baseline_at=extreme("stability_evidence", "baseline_at", min),
            latest_drop=extreme("stability_evidence", "latest_drop", max),
            worst_drop=extreme("stability_evidence", "worst_drop", max),
            weighted_runs=round(summed("stability_evidence", "weighted_runs"), 3),
            weighted_drop=round(summed("stability_evidence", "weighted_drop"), 3),
        ),
        nodes=len(parts),
        half_life_days=HALF_LIFE / timedelta(days=1),
        lookback_days=LOOKBACK / timedelta(days=1),
        computed_at=now,
    )


def evaluation_times(registered_at: datetime, now: datetime, days: int) -> list[datetime]:
    """The ends of the last `days - 1` UTC days the node existed in, then `now`."""
    today = step_start(step_of(now)).replace(hour=0)
    ends = [today - timedelta(days=n) for n in range(days - 2, -1, -1)]
    return [at for at in ends if at > registered_at and at < now] + [now]


def series(record: NodeRecord, now: datetime, days: int = 30) -> list[Reliability]:
    """The score at the end of each recent day and now, computed as it would have been
    then from the record (which must reach back `LOOKBACK` before the first day)."""
    times = evaluation_times(record.registered_at, now, days)
    since = max(bucket_of(record.registered_at), lookback_start(times[0]))
    until = bucket_of(now)
    expected = window_buckets(open_intervals(record.availability, since, until), since, until)
    return [score(record, at, expected) for at in times]


def point(reliability: Reliability, at: datetime) -> ReliabilityPoint:
    return ReliabilityPoint(
        at=at,
        score=reliability.score,
        uptime=reliability.uptime,
        completion=reliability.completion,
        stability=reliability.stability,
    )


@dataclass(frozen=True)
class History:
    """Which components of a node's score rest on its own record. One without is its
    start moved only by the ageing probation: a figure with nothing behind it, which pages
    show as "no history yet" rather than as a number."""

    uptime: bool
    completion: bool
    stability: bool

    @property
    def any(self) -> bool:
        return self.uptime or self.completion or self.stability

    @classmethod
    def of_nodes(cls, nodes: Iterable["History"]) -> "History":
        """A provider's: a component has history when one of its nodes' has."""
        found = list(nodes)
        return cls(
            uptime=any(h.uptime for h in found),
            completion=any(h.completion for h in found),
            stability=any(h.stability for h in found),
        )


def history(reliability: Reliability) -> History:
    """Which components of a node's published score have evidence: uptime an hour of
    window time (evidence is dated by the hour) or any of it offline (which lowers the
    score at once), completion one job, stability one run measured against an earlier
    first run. Not for a provider's combined score, whose evidence is summed over its
    nodes: ask of each node."""
    up = reliability.uptime_evidence
    return History(
        uptime=up.hours_in_windows >= STEP_SEC / 3600 or up.hours_online < up.hours_in_windows,
        completion=reliability.completion_evidence.jobs_counted > 0,
        stability=reliability.stability_evidence.runs_counted > 0,
    )


def start_of(reliability: Reliability | None) -> float:
    """The score a node started from, kept with its published score (set at registration,
    carried by every later one); a node scored before starts were kept started at `NEUTRAL`."""
    if reliability is None or reliability.start is None:
        return NEUTRAL
    return reliability.start
