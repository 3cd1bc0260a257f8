"""The Ray Serve peer: one deployment per model, each keeping its session loaded.

A local Ray cluster of its own (loopback, no dashboard, usage stats off when the caller
sets RAY_USAGE_STATS_ENABLED=0), Serve's HTTP proxy on the given port, and per model a
deployment at `/<name>` that takes the inputs NPZ as the request body and answers the
outputs NPZ: the shape of the Ray Serve examples (an `async __call__` reading the
Starlette request). It prints "ready" once every deployment answers and shuts Serve and
Ray down on SIGTERM or SIGINT.

Run: python bench/peers/ray_app.py --port PORT --threads 2 --model digits=PATH ...
"""

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import ray
from inference import open_session, run_npz
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


class OnnxModel:
    def __init__(self, model: str, threads: int) -> None:
        self.session = open_session(model, threads)

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        return Response(run_npz(self.session, body), media_type="application/octet-stream")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--cpus", type=int, required=True, help="Ray's num_cpus")
    parser.add_argument("--temp-dir", type=Path, required=True)
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH")
    args = parser.parse_args()
    models = dict(m.split("=", 1) for m in args.model)

    ray.init(
        address="local",
        num_cpus=args.cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(args.temp_dir),
        log_to_driver=False,
        logging_level="WARNING",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # ray.init took SIGTERM over
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        deployment: Any = serve.deployment(
            OnnxModel, num_replicas=1, ray_actor_options={"num_cpus": 0}
        )
        for name, path in models.items():
            app = deployment.options(name=name).bind(path, args.threads)
            serve.run(app, name=name, route_prefix=f"/{name}")
        print("ready", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
