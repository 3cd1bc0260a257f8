"""The coordinator's measurements in Prometheus' terms (`GET /metrics`, docs/operations.md).

Two kinds:
- **Events, counted where they happen**, per process: requests and their latency by
  route, claims and their latency, invokes ending by status, session forwards, ledger
  postings, webhook attempts. A count that follows a database change (an invoke ending, a
  posting) is made when its transaction commits (`after_commit`), never for one rolled
  back. With `PROMETHEUS_MULTIPROC_DIR` set before the server starts (several server
  processes), each process writes its values to files there and a scrape of any of them
  adds them all up (prometheus_client's multiprocess mode; empty the folder at deploy).
- **State, read at the scrape** from the database (`Reading`s, made by
  `services.platform.metrics`): queues, nodes, sessions, storage, money, deliveries and
  payouts. Every replica answers the same, since they share the database.
"""

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

# A `_created` series beside every counter says nothing a dashboard uses.
disable_created_metrics()  # type: ignore[no-untyped-call]
EVENTS = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "gpushare_http_requests",
    "Requests answered, by method, route template and status code",
    ["method", "route", "status"],
    registry=EVENTS,
)
HTTP_SECONDS = Histogram(
    "gpushare_http_request_seconds",
    "Time to answer a request, by route template (long-polls included)",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=EVENTS,
)
CLAIM_SECONDS = Histogram(
    "gpushare_claim_seconds",
    "A node's claim of queued work (its statements, before the commit), found or not",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
    registry=EVENTS,
)
CLAIMED_JOBS = Counter(
    "gpushare_claimed_jobs", "Invokes leased to nodes by claims", registry=EVENTS
)
INVOKES_ENDED = Counter(
    "gpushare_invokes_ended",
    "Invokes that reached a final status (done, failed, timeout, canceled), at commit",
    ["status"],
    registry=EVENTS,
)
SESSION_FORWARDS = Counter(
    "gpushare_session_forwards",
    "Session forwards answered, by outcome (ok: the model answered; error: anything else)",
    ["outcome"],
    registry=EVENTS,
)
FORWARD_SECONDS = Histogram(
    "gpushare_session_forward_seconds",
    "Time to answer a session forward (the model's answer or an error)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
    registry=EVENTS,
)
LEDGER_POSTINGS = Counter(
    "gpushare_ledger_postings",
    "Ledger transactions posted, by kind, at commit",
    ["kind"],
    registry=EVENTS,
)
LEDGER_MOVED = Counter(
    "gpushare_ledger_moved_micro_usdc",
    "Micro-USDC the committed postings moved (the sum of their credits), by kind",
    ["kind"],
    registry=EVENTS,
)
WEBHOOK_ATTEMPTS = Counter(
    "gpushare_webhook_attempts",
    "Webhook delivery attempts, by outcome (delivered, retrying, failed)",
    ["outcome"],
    registry=EVENTS,
)


@dataclass(frozen=True)
class Reading:
    """A gauge read from the database at the scrape: one value per label set."""

    name: str
    help: str
    labels: tuple[str, ...]
    values: Sequence[tuple[tuple[str, ...], float]]


def exposition(readings: Iterable[Reading]) -> bytes:
    """The text a scrape answers: this process's events (every process's, in
    multiprocess mode), then the readings."""
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROCESS_DIR):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Events())
    registry.register(_Readings(list(readings)))
    return generate_latest(registry)


class _Events(Collector):
    def collect(self) -> Iterable[Any]:
        return EVENTS.collect()


class _Readings(Collector):
    def __init__(self, readings: list[Reading]) -> None:
        self._readings = readings

    def collect(self) -> Iterable[Any]:
        for reading in self._readings:
            family = GaugeMetricFamily(reading.name, reading.help, labels=reading.labels)
            for labels, value in reading.values:
                family.add_metric(labels, value)
            yield family


_ON_COMMIT = "gpushare_metrics_on_commit"


def after_commit(session: AsyncSession, count: Callable[[], None]) -> None:
    """Call `count` when the session's transaction commits, and never if it rolls back: a
    count of what the database now says happened."""
    session.sync_session.info.setdefault(_ON_COMMIT, []).append(count)


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    for count in session.info.pop(_ON_COMMIT, ()):
        count()


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_ON_COMMIT, None)
