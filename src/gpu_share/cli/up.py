"""`gpu-share up`: everything on this machine, one process, embedded defaults."""

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from gpu_share.cli._extras import require_extra


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the coordinator on SQLite with a local agent, and print keys and a curl example",
        description="Start GPU Share on this machine: coordinator (SQLite, local artifact "
        "directory) and a local agent on this machine's hardware. State lives in "
        "GPUSHARE_DATA_DIR (default ./.gpushare).",
    )
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--sandbox", choices=["auto", "docker", "bwrap", "process"], default="auto")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    require_extra("all", "fastapi", "sqlalchemy", "uvicorn", "psutil", "onnxruntime")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return asyncio.run(_serve(args))


async def _upload_examples(base_url: str, tenant_key: str) -> dict[str, str]:
    """Upload the example model and inputs as the demo tenant; returns their URLs."""
    import httpx

    from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL

    urls = {}
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
        for name, kind, path in (
            ("model", "model", DIGITS_MODEL),
            ("inputs", "inputs", DIGITS_INPUTS),
        ):
            data = path.read_bytes()
            response = await http.post(
                "/v1/artifacts",
                params={"kind": kind, "content_sha256": hashlib.sha256(data).hexdigest()},
                content=data,
                headers={"Authorization": f"Bearer {tenant_key}"},
            )
            response.raise_for_status()
            urls[name] = response.json()["url"]
    return urls


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import SecretStr

    from gpu_share.agent.settings import AgentSettings
    from gpu_share.agent.worker import Agent
    from gpu_share.coordinator import embedded
    from gpu_share.coordinator.app import create_app
    from gpu_share.coordinator.core.clock import SystemClock
    from gpu_share.coordinator.core.settings import Settings
    from gpu_share.protocol.runtimes import RuntimeName

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = Settings(**overrides)
    clock = SystemClock()
    creds = await embedded.prepare(settings, clock)
    settings.admin_key = SecretStr(creds.admin_key)
    base_url = settings.public_base_url or f"http://{settings.host}:{settings.port}"
    app = create_app(settings, clock=clock)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    serving = asyncio.create_task(server.serve())
    # uvicorn offers no startup event to wait on
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if serving.done():
        return 1

    agent = await asyncio.to_thread(
        Agent,
        AgentSettings(
            server=base_url,
            token=SecretStr(creds.enrollment_token),
            data_dir=Path(settings.data_dir) / "agent",
            sandbox=args.sandbox,
        ),
    )
    stop = asyncio.Event()
    agent_task = asyncio.create_task(agent.run(stop, drain_timeout=5.0))
    examples = await _upload_examples(base_url, creds.tenant_key)
    runtime = (
        RuntimeName.ONNX_CUDA if RuntimeName.ONNX_CUDA in agent.runtimes else RuntimeName.ONNX_CPU
    )
    print(_banner(base_url, creds, settings, examples, runtime, agent), flush=True)
    try:
        await serving
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent_task, 15)
    return 0


def _banner(
    base_url: str, creds: Any, settings: Any, examples: dict[str, str], runtime: Any, agent: Any
) -> str:
    body = json.dumps(
        {
            "runtime": runtime.value,
            "model_url": examples["model"],
            "inputs_url": examples["inputs"],
            "timeout_sec": 60,
        }
    )
    auth = f'-H "Authorization: Bearer {creds.tenant_key}"'
    gpus = ", ".join(g.info.model for g in agent.gpus) or "no GPU (CPU node)"
    runtimes = ", ".join(r.value for r in agent.runtimes)
    return f"""
GPU Share is up at {base_url}   (state in {Path(settings.data_dir).resolve()})
Local agent: {gpus}; runtimes {runtimes}; {agent.sandbox.name} sandbox

  Admin key:        {creds.admin_key}
  Demo tenant key:  {creds.tenant_key}

Try it: classify 8 digit images with the example model (uploaded for the demo tenant):

  curl -s -X POST {base_url}/v1/gpu/invoke {auth} \\
    -H "Content-Type: application/json" \\
    -d '{body}'

  curl -s {base_url}/v1/gpu/invokes/INVOKE_ID {auth}

The result's outputs_inline_base64 is an NPZ with "label" and "probabilities".
More: {base_url}/docs     Stop with Ctrl+C.
"""
