"""Which parts of a node's score rest on its own record (`reliability_formula.history`):
pages show the others as "no history yet" rather than as figures nothing is behind."""

from datetime import UTC, datetime, timedelta

from gpu_share.coordinator.services.nodes.presence import bucket_of
from gpu_share.coordinator.services.providers.reliability_formula import (
    NEUTRAL,
    BenchmarkScores,
    History,
    JobOutcome,
    NodeRecord,
    history,
    record_from_buckets,
    score,
    start_of,
)
from gpu_share.protocol.schedules import Availability

NOW = datetime(2026, 3, 4, 12, 7, tzinfo=UTC)
FIVE_MINUTES = timedelta(minutes=5)


def online(since: datetime) -> list[datetime]:
    found, at = [], bucket_of(since)
    while at < NOW:
        found.append(at)
        at += FIVE_MINUTES
    return found


def test_a_new_node_with_its_first_benchmark_has_no_history_and_its_score_did_not_move() -> None:
    registered = NOW - timedelta(minutes=30)
    first = BenchmarkScores(registered + timedelta(minutes=2), {"node": 1.0})
    record = record_from_buckets(
        registered, Availability(), online(registered), NOW, benchmarks=[first]
    )
    published = score(record, NOW)
    unbenchmarked = score(record_from_buckets(registered, Availability(), [], NOW), NOW)
    # The first run is the baseline, measured against nothing: no evidence either way
    # (it once counted as a clean run and lifted a new node's stability to ~0.933).
    assert published.stability == unbenchmarked.stability < NEUTRAL + 0.001
    evidence = published.stability_evidence
    assert evidence.runs_counted == 0 and evidence.latest_drop is None
    assert evidence.baseline_at == first.at
    assert history(published) == History(uptime=False, completion=False, stability=False)
    assert not history(published).any
    assert start_of(published) == NEUTRAL


def test_an_hour_in_the_windows_a_job_or_a_second_run_is_history() -> None:
    registered = NOW - timedelta(hours=2)
    runs = [BenchmarkScores(registered, {"node": 1.0}), BenchmarkScores(NOW, {"node": 0.5})]
    record = record_from_buckets(registered, Availability(), online(registered), NOW)
    assert history(score(record, NOW)) == History(uptime=True, completion=False, stability=False)
    job = NodeRecord(NOW, outcomes=[JobOutcome(NOW, provider_failure=False)])
    assert history(score(job, NOW)) == History(uptime=False, completion=True, stability=False)
    benchmarked = NodeRecord(NOW - timedelta(minutes=1), benchmarks=runs)
    assert history(score(benchmarked, NOW)).stability


def test_time_offline_in_the_windows_is_history_at_once() -> None:
    registered = NOW - timedelta(minutes=30)
    record = record_from_buckets(registered, Availability(), [], NOW)  # never beat
    published = score(record, NOW)
    assert published.uptime < NEUTRAL
    assert history(published).uptime


def test_a_node_starts_where_its_published_score_says() -> None:
    record = NodeRecord(NOW, start=0.62)
    assert start_of(score(record, NOW)) == 0.62
    assert start_of(None) == NEUTRAL


def test_a_provider_has_history_in_a_part_when_one_of_its_nodes_has() -> None:
    parts = [History(True, False, False), History(False, False, True)]
    assert History.of_nodes(parts) == History(uptime=True, completion=False, stability=True)
    assert not History.of_nodes([]).any
