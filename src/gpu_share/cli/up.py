"""`gpu-share up`: everything on this machine, one process, embedded defaults.

Ctrl+C stops the agent first and the server after it, so the agent's last requests
still find the coordinator whole. A job the agent leaves running is requeued when its
lease expires after the next start: never lost.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_share.cli._extras import require_extra
from gpu_share.cli.server import (
    CannotListen,
    CoordinatorServer,
    listen_on,
    on_stop_signals,
    set_startup_heap_aside,
)
from gpu_share.hashing import sha256_file

log = logging.getLogger("gpu_share.up")

# Ctrl+C stops at once: running jobs are left to their leases (requeued after the next
# start), and the server's requests in flight get this long to finish.
GRACEFUL_SEC = 1
AGENT_READY_SEC = 30.0


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the coordinator on SQLite with a local agent, and print keys and a curl example",
        description="Start GPU Share on this machine: coordinator (SQLite, local artifact "
        "directory) and a local agent on this machine's hardware. State lives in "
        "GPUSHARE_DATA_DIR (default ./.gpushare).",
    )
    parser.add_argument("--host", help="bind address (GPUSHARE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (GPUSHARE_PORT, default 8080)")
    parser.add_argument("--sandbox", choices=["auto", "docker", "bwrap", "process"], default="auto")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    require_extra("all", "fastapi", "sqlalchemy", "uvicorn", "psutil", "onnxruntime")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.log_level != "debug":  # a line per heartbeat, lease and log chunk buries the banner
        logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(_up(args))


@dataclass
class Example:
    url: str
    sha256: str


async def _upload_examples(base_url: str, tenant_key: str) -> dict[str, Example]:
    """Upload the example model and inputs as the demo tenant."""
    import httpx

    from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL

    examples = {}
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
        for kind, path in (("model", DIGITS_MODEL), ("inputs", DIGITS_INPUTS)):
            sha256 = sha256_file(path)
            response = await http.post(
                "/v1/artifacts",
                params={"kind": kind, "content_sha256": sha256},
                content=path.read_bytes(),
                headers={"Authorization": f"Bearer {tenant_key}"},
            )
            response.raise_for_status()
            examples[kind] = Example(response.json()["url"], sha256)
    return examples


async def _up(args: argparse.Namespace) -> int:
    from gpu_share.coordinator.core.settings import Settings

    overrides: dict[str, object] = {
        k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None
    }
    if "GPUSHARE_DEMO_MONEY" not in os.environ:
        # Prepaid with demo money (unless GPUSHARE_BILLING=free): a newcomer sees prices,
        # charges and earnings from the first invoke, all of them marked as demo money.
        overrides["demo_money"] = True
    settings = Settings(**overrides)  # type: ignore[arg-type]
    try:
        sock = listen_on(settings.host, settings.port)
    except CannotListen as exc:
        print(f"gpu-share up: {exc}", file=sys.stderr)
        return 2
    stack = _Stack(args, settings, sock)
    stopping = asyncio.Event()
    code = 0
    with on_stop_signals(stopping.set):
        starting = asyncio.create_task(stack.start())
        waiting = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                banner = starting.result()
                if banner is None:
                    code = 1
                else:
                    print(banner, flush=True)
                    set_startup_heap_aside()
                    code = await stack.until_stopped(stopping)
        finally:
            waiting.cancel()
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            left_running = await stack.stop()
    if left_running:
        print(f"stopped; {left_running} running job(s) will be requeued after the next start")
    else:
        print("stopped")
    return code


class _Stack:
    """The coordinator and the local agent, started and stopped in order."""

    def __init__(self, args: argparse.Namespace, settings: Any, sock: socket.socket) -> None:
        self.args = args
        self.settings = settings
        self.sock = sock
        self.base_url = settings.public_base_url or f"http://{settings.host}:{settings.port}"
        # Links in mails and the agent's installer come from the public URL alone, never a
        # request's Host: on one machine it is the address printed in the banner.
        settings.public_base_url = self.base_url
        self.server: CoordinatorServer | None = None
        self.agent: Any = None
        self.agent_task: asyncio.Task[None] | None = None
        self.agent_stop = asyncio.Event()

    async def start(self) -> str | None:
        """Start both; the banner to print, or None when something failed (and said why)."""
        from pydantic import SecretStr

        from gpu_share.agent.sandbox import SandboxUnavailable
        from gpu_share.agent.settings import AgentSettings
        from gpu_share.agent.worker import Agent, AgentStartError
        from gpu_share.coordinator import embedded
        from gpu_share.coordinator.app import create_app
        from gpu_share.coordinator.core.clock import SystemClock

        settings = self.settings
        clock = SystemClock()
        creds = await embedded.prepare(settings, clock)
        settings.admin_key = SecretStr(creds.admin_key)
        self.server = CoordinatorServer(
            create_app(settings, clock=clock),
            self.sock,
            log_level="debug" if self.args.log_level == "debug" else "warning",
            graceful_sec=GRACEFUL_SEC,
            ws_max_size=settings.websocket_max_bytes,
        )
        if not await self.server.start():
            return None
        try:
            agent = await asyncio.to_thread(
                Agent,
                AgentSettings(
                    server=self.base_url,
                    token=SecretStr(creds.enrollment_token),
                    data_dir=Path(settings.data_dir) / "agent",
                    sandbox=self.args.sandbox,
                    # This machine's owner runs their own jobs here: the process sandbox
                    # (with its warning) is better than no local agent.
                    allow_unisolated=True,
                ),
            )
        except (SandboxUnavailable, AgentStartError) as exc:
            print(f"gpu-share up: {exc}", file=sys.stderr)
            return None
        self.agent = agent
        self.agent_task = asyncio.create_task(agent.run(self.agent_stop, drain_timeout=0))
        if not await self._agent_ready():
            return None
        await embedded.price_local_node(settings, clock, creds.enrollment_token)
        examples = await _upload_examples(self.base_url, creds.tenant_key)
        return _banner(self.base_url, creds, settings, examples, agent)

    async def _agent_ready(self) -> bool:
        """Registered and its session channel connected, so its log lines precede the banner."""
        assert self.agent_task is not None
        online = asyncio.create_task(self.agent.online.wait())
        await asyncio.wait({online, self.agent_task}, return_when=asyncio.FIRST_COMPLETED)
        online.cancel()
        if self.agent_task.done():
            return False  # `stop()` says why
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.agent.session_host.connected.wait(), AGENT_READY_SEC)
        return True

    async def until_stopped(self, stopping: asyncio.Event) -> int:
        """Serve until Ctrl+C (0), or until the server or the agent ends by itself (1)."""
        assert self.server is not None and self.server.serving is not None
        assert self.agent_task is not None
        waiting = asyncio.create_task(stopping.wait())
        await asyncio.wait(
            {waiting, self.server.serving, self.agent_task}, return_when=asyncio.FIRST_COMPLETED
        )
        waiting.cancel()
        return 0 if stopping.is_set() else 1

    async def stop(self) -> int:
        """The agent, then the server; returns how many jobs the agent left running."""
        if self.agent_task is not None:
            self.agent_stop.set()
            await asyncio.wait({self.agent_task})
            self._report_agent_end()
        if self.server is not None:
            await self.server.stop()
        else:
            self.sock.close()
        return self.agent.left_running if self.agent is not None else 0

    def _report_agent_end(self) -> None:
        assert self.agent_task is not None
        if self.agent_task.cancelled() or self.agent_task.exception() is None:
            return
        exc = self.agent_task.exception()
        from gpu_share.agent.worker import AgentStartError

        if isinstance(exc, AgentStartError):
            print(f"gpu-share up: the local agent cannot start: {exc}", file=sys.stderr)
        else:
            log.error("the local agent stopped", exc_info=exc)


def _banner(
    base_url: str, creds: Any, settings: Any, examples: dict[str, Example], agent: Any
) -> str:
    from gpu_share.coordinator import embedded
    from gpu_share.coordinator.services.money import billing
    from gpu_share.protocol.money import usdc_text
    from gpu_share.protocol.runtimes import RuntimeName

    runtime = (
        RuntimeName.ONNX_CUDA if RuntimeName.ONNX_CUDA in agent.runtimes else RuntimeName.ONNX_CPU
    )
    body = json.dumps(
        {
            "runtime": runtime.value,
            "model_url": examples["model"].url,
            "model_checksum_sha256": examples["model"].sha256,
            "inputs_url": examples["inputs"].url,
            "inputs_checksum_sha256": examples["inputs"].sha256,
            "timeout_sec": 60,
        }
    )
    auth = f'-H "Authorization: Bearer {creds.tenant_key}"'
    gpus = ", ".join(g.info.model for g in agent.gpus) or "no GPU (CPU node)"
    runtimes = ", ".join(r.value for r in agent.runtimes)
    money = (
        f"""
Demo money (nothing real is paid): the demo tenant was given \
{usdc_text(embedded.DEMO_TOP_UP.amount)} USDC,
and this machine charges {usdc_text(embedded.DEMO_CPU_PRICE.price_per_gpu_hour)} USDC an hour \
on CPU, {usdc_text(embedded.DEMO_GPU_PRICE.price_per_gpu_hour)} USDC per GPU-hour.
  Charges:   {base_url}/console/usage     (sign in with the demo tenant key)
  Earnings:  {base_url}/provider/earnings (sign in with the provider key)
"""
        if billing.demo_money(settings)
        else ""
    )
    return f"""
GPU Share is up at {base_url}   (state in {Path(settings.data_dir).resolve()})
Local agent: {gpus}; runtimes {runtimes}; {agent.sandbox.name} sandbox

  Admin key:        {creds.admin_key}
  Demo tenant key:  {creds.tenant_key}
  Provider key:     {creds.provider_key}   (this machine's dashboard: pricing, earnings)
{money}
Try it: classify 8 digit images with the example model (uploaded for the demo tenant):

  curl -s -X POST {base_url}/v1/gpu/invoke {auth} \\
    -H "Content-Type: application/json" \\
    -d '{body}'

  curl -s {base_url}/v1/gpu/invokes/INVOKE_ID {auth}

The result's outputs_inline_base64 is an NPZ with "label" and "probabilities".
More: {base_url}/docs     Stop with Ctrl+C.
"""
