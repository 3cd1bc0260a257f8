"""`gpu-share up`: everything on this machine, one process, embedded defaults."""

import argparse
import asyncio
import logging
from typing import Any

from gpu_share.cli._extras import require_extra


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the coordinator on SQLite with a local agent, and print keys and a curl example",
        description="Start GPU Share on this machine: coordinator (SQLite, local artifact "
        "directory) and a local agent. State lives in GPUSHARE_DATA_DIR (default ./.gpushare).",
    )
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    require_extra("server", "fastapi", "sqlalchemy", "uvicorn")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import SecretStr

    from gpu_share.coordinator import embedded
    from gpu_share.coordinator.app import create_app
    from gpu_share.coordinator.clock import SystemClock
    from gpu_share.coordinator.settings import Settings

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = Settings(**overrides)
    clock = SystemClock()
    creds = await embedded.prepare(settings, clock)
    settings.admin_key = SecretStr(creds.admin_key)
    base_url = settings.public_base_url or f"http://{settings.host}:{settings.port}"
    app = create_app(settings, clock=clock)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=False
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    # uvicorn offers no startup event to wait on
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if serving.done():
        return 1
    print(_banner(base_url, creds, settings), flush=True)
    await serving
    return 0


def _banner(base_url: str, creds: Any, settings: Any) -> str:
    return f"""
GPU Share is up at {base_url}  (data in {settings.data_dir.resolve()})

  Admin key:        {creds.admin_key}
  Demo tenant key:  {creds.tenant_key}

Try it:
  curl -s {base_url}/health
  curl -s -X POST "{base_url}/v1/artifacts?kind=model" \\
    -H "Authorization: Bearer {creds.tenant_key}" \\
    -H "Content-Type: application/octet-stream" \\
    --data-binary @examples/digits.onnx

API docs: {base_url}/docs      Stop with Ctrl+C.
"""
