"""The Celery peer: a worker that runs ONNX models for tasks sent through Redis.

Two tasks, the two ways a Celery user would serve a model:
  `peers.infer_fresh` opens an onnxruntime session on the model file for every task
      (isolation between tasks means a fresh load, as each of our invokes gets);
  `peers.infer_held` keeps one session per model for the life of the worker process.
Both take the model's path on the worker's disk and the inputs as NPZ bytes, and return
the outputs as NPZ bytes (Celery's default JSON serializer carries bytes as base64).

The worker is what a user gets from `celery worker --pool prefork --concurrency 1`: the
default pool, one child process running the tasks, the parent taking them from Redis.

Run: python bench/peers/celery_app.py --redis-url redis://127.0.0.1:PORT/0 --threads 2
"""

import argparse
from typing import Any

from celery import Celery
from inference import open_session, run_npz

app = Celery("peers")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)

_threads = 1  # set by main() before the pool forks
_held: dict[str, Any] = {}


def configure(redis_url: str) -> Celery:
    app.conf.update(broker_url=redis_url, result_backend=redis_url)
    return app


def infer_fresh(model: str, body: bytes) -> bytes:
    return run_npz(open_session(model, _threads), body)


def infer_held(model: str, body: bytes) -> bytes:
    session = _held.get(model)
    if session is None:
        session = _held[model] = open_session(model, _threads)
    return run_npz(session, body)


app.task(name="peers.infer_fresh")(infer_fresh)
app.task(name="peers.infer_held")(infer_held)


def main() -> None:
    global _threads
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    _threads = args.threads
    configure(args.redis_url)
    app.worker_main(
        ["worker", "--pool=prefork", "--concurrency=1", "--loglevel=WARNING", "-n", "peers@%h"]
    )


if __name__ == "__main__":
    main()
