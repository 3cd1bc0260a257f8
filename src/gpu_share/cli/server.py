"""`gpu-share server`: the coordinator alone (production: PostgreSQL, many replicas)."""

import argparse
import logging
from typing import Any


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "server",
        help="run the coordinator (settings from GPUSHARE_* environment variables)",
        description="Run the coordinator. Settings come from GPUSHARE_* variables; "
        "see README for the list.",
    )
    parser.add_argument("--host", help="bind address (GPUSHARE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (GPUSHARE_PORT, default 8080)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpu_share.cli._extras import require_extra

    require_extra("server", "fastapi", "sqlalchemy", "uvicorn")
    import uvicorn

    from gpu_share.coordinator.app import create_app
    from gpu_share.coordinator.core.settings import Settings

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = Settings(**overrides)
    app = create_app(settings, on_admin_key=_print_admin_key)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=False
    )
    return 0


def _print_admin_key(key: str) -> None:
    print(f"\nAdmin key (shown once, store it now): {key}\n", flush=True)
