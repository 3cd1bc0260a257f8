"""`gpu-share agent`: run the provider agent on this machine."""

import argparse
import asyncio
import logging
import signal
from typing import Any

from gpu_share import logs
from gpu_share.cli._extras import require_extra


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help="run the provider agent: detect GPUs, register, run jobs",
        description="Run the GPU Share agent. Settings also come from GPUSHARE_AGENT_* variables.",
    )
    parser.add_argument("--server", help="coordinator URL (GPUSHARE_AGENT_SERVER)")
    parser.add_argument("--token", help="enrollment token gpu_et_… (first start only)")
    parser.add_argument(
        "--data-dir", help="identity, cache and job folders (default .gpushare-agent)"
    )
    parser.add_argument("--max-jobs", type=int, help="jobs at once (default: one per GPU, or 1)")
    parser.add_argument("--sandbox", choices=["auto", "docker", "bwrap", "process"])
    parser.add_argument(
        "--allow-unisolated",
        action="store_true",
        default=None,
        help="where neither Docker nor bubblewrap works, run other people's jobs as plain "
        "processes that can reach the network and this machine's files; tenants see the "
        "node as not isolated (GPUSHARE_AGENT_ALLOW_UNISOLATED)",
    )
    parser.add_argument("--region", help="where this machine is, e.g. eu-west")
    parser.add_argument(
        "--allow-network",
        action="append",
        default=None,
        metavar="CIDR",
        help="let jobs fetch from this private network (testing only)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(run=run)


def settings_from(args: argparse.Namespace) -> Any:
    from gpu_share.agent.settings import AgentSettings

    overrides = {
        "server": args.server,
        "token": args.token,
        "data_dir": args.data_dir,
        "max_concurrent_jobs": args.max_jobs,
        "sandbox": args.sandbox,
        "allow_unisolated": args.allow_unisolated,
        "region": args.region,
        "allow_networks": args.allow_network,
    }
    return AgentSettings(**{k: v for k, v in overrides.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    require_extra("agent", "psutil", "pydantic_settings")
    from pydantic import ValidationError

    try:
        settings = settings_from(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        print(f"gpu-share agent: {field}: {first['msg']} (use --{field.replace('_', '-')})")
        return 2
    logs.configure(args.log_level, settings.log_format)
    if args.log_level != "debug":  # one line per request is noise at info level
        logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(_run(settings))


async def _run(settings: Any) -> int:
    from gpu_share.agent.sandbox import SandboxUnavailable
    from gpu_share.agent.worker import Agent, AgentStartError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        agent = await asyncio.to_thread(Agent, settings)
        await agent.run(stop, drain_timeout=settings.drain_timeout_sec)
    except (AgentStartError, SandboxUnavailable) as exc:
        print(f"gpu-share agent: {exc}")
        return 2
    print("stopped")
    return 0
