"""`gpu-share server`: the coordinator alone (production: PostgreSQL, many replicas).

`CoordinatorServer` is also how `gpu-share up` serves: on a socket bound before anything
else starts (so a busy port is one line, not a traceback), with signals left to the
command, and a shutdown that lets the requests in flight finish before the app closes
its database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpu_share import logs

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI


class CannotListen(Exception):
    """The address to serve on cannot be bound; the message says what to change."""


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
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="coordinator processes sharing the port (PostgreSQL only; default 1)",
    )
    parser.add_argument("--inherit-fd", type=int, help=argparse.SUPPRESS)  # a worker's socket
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpu_share.cli._extras import require_extra

    require_extra("server", "fastapi", "sqlalchemy", "uvicorn")
    if problem := _metrics_folder_problem():
        print(f"gpu-share server: {problem}", file=sys.stderr)
        return 2
    from gpu_share.coordinator.core.settings import Settings

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = Settings(**overrides)
    logs.configure(args.log_level, settings.log_format)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.log_level != "debug":  # one line per outgoing request is noise at info level
        logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.workers < 1:
        print("gpu-share server: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers > 1 and not settings.database_url.startswith("postgresql"):
        print(
            "gpu-share server: several workers need PostgreSQL "
            "(GPUSHARE_DATABASE_URL=postgresql+asyncpg://…); a SQLite file serves one process",
            file=sys.stderr,
        )
        return 2
    try:
        if args.inherit_fd is not None:  # a worker of `--workers`: the parent bound it
            sock = socket.socket(fileno=args.inherit_fd)
        else:
            sock = listen_on(settings.host, settings.port)
    except CannotListen as exc:
        print(f"gpu-share server: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1:
        from gpu_share.cli.workers import run_workers

        return run_workers(sock, args.workers, args.log_level)
    if not settings.public_base_url and args.inherit_fd is None:
        logging.getLogger("gpu_share.server").warning(
            "GPUSHARE_PUBLIC_BASE_URL is not set: the agent's install script names no "
            "coordinator (providers must pass --server) and links in mails point at %s",
            settings.mail_base_url,
        )
    from gpu_share.coordinator.app import create_app

    app = create_app(settings, on_admin_key=_print_admin_key)
    server = CoordinatorServer(
        app,
        sock,
        log_level=args.log_level,
        ws_max_size=settings.websocket_max_bytes,
        own_log_format=settings.log_format == "text",
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(server))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (uvicorn's `standard` extra brings it on Linux and
    macOS), as uvicorn runs its own loop: ~3–5 % less CPU a job (bench/README.md,
    dispatch); else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(server: CoordinatorServer) -> int:
    stopping = asyncio.Event()
    with on_stop_signals(stopping.set):
        if not await server.start():
            return 1
        set_startup_heap_aside()
        assert server.serving is not None
        waiting = asyncio.create_task(stopping.wait())
        await asyncio.wait({waiting, server.serving}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        await server.stop()
    return 0 if stopping.is_set() else 1


def set_startup_heap_aside() -> None:
    """Take what the started server holds for good (its modules, the app, its routes and
    schemas) out of the cyclic garbage collector's sight (`gc.freeze`), so that a full
    collection walks only what requests made. A submit at 1,000 online nodes makes enough
    objects to run one every dozen submits: with the startup heap in it, each took
    150–180 ms (submit p99 234 ms); without, under 4 ms (p99 66 ms; bench/README.md,
    `submit_scale.py`). For a serving process only: frozen objects are never collected
    as cycles, so a process that makes and drops apps (the tests) would keep them."""
    gc.collect()
    gc.freeze()
    logging.getLogger("gpu_share.server").info(
        "set the startup heap aside from the garbage collector: %d objects",
        gc.get_freeze_count(),
    )


def _print_admin_key(key: str) -> None:
    print(f"\nAdmin key (shown once, store it now): {key}\n", flush=True)


def listen_on(host: str, port: int) -> socket.socket:
    """The server's socket, bound; `CannotListen` says why not in one line."""
    from gpu_share.coordinator.http.sockets import bound_tcp

    try:
        return bound_tcp(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(f"port {port} is in use: pass --port or set GPUSHARE_PORT") from exc
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def on_stop_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Ctrl+C or SIGTERM calls `stop`; a second one ends the process at once.

    Ending at once is as safe as a crash, which loses nothing: every state change is a
    database transaction, and a lease nobody reports on expires and is requeued.
    """
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    received = 0

    def handle() -> None:
        nonlocal received
        received += 1
        if received == 1:
            stop()
            return
        print("stopped without waiting", flush=True)
        os._exit(128 + signal.SIGINT)

    for sig in signals:
        loop.add_signal_handler(sig, handle)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _metrics_folder_problem() -> str | None:
    """Several processes' metrics go to files in PROMETHEUS_MULTIPROC_DIR
    (`coordinator.core.metrics`); checked before the app is imported, which opens them."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder or os.path.isdir(folder):
        return None
    return (
        f"PROMETHEUS_MULTIPROC_DIR={folder} is not a folder: create it (empty) before the "
        "server processes start, or unset it to count each process apart"
    )


class CoordinatorServer:
    """uvicorn serving the coordinator app on a bound socket until `stop()`.

    Stopping takes no new connections, answers the long-polls, waits for the requests
    in flight (up to `graceful_sec`), and only then runs the app's shutdown.
    """

    def __init__(
        self,
        app: FastAPI,
        sock: socket.socket,
        *,
        log_level: str,
        ws_max_size: int,
        graceful_sec: int | None = None,
        own_log_format: bool = True,
    ) -> None:
        """`own_log_format=False`: uvicorn's lines go through the root logger's format (JSON
        lines, `gpu_share.logs`) instead of uvicorn's own."""
        import uvicorn

        from gpu_share.coordinator.http.sockets import KEEP_ALIVE_SEC

        uvicorn_logging: dict[str, Any] = {} if own_log_format else {"log_config": None}

        self._sock = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            **uvicorn_logging,
            timeout_graceful_shutdown=graceful_sec,
            # Agents' session channels carry forwards and answers up to the settings' limit;
            # uvicorn's 16 MiB default would drop a node's channel, and all its sessions.
            ws_max_size=ws_max_size,
            # The app reads X-Forwarded-For itself, from the proxies the operator names
            # (GPUSHARE_TRUSTED_PROXIES); uvicorn's own default trusts 127.0.0.1.
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_SEC,
        )
        self._server = _uvicorn_server(app, config)
        self.serving: asyncio.Task[None] | None = None  # ends when the server does

    async def start(self) -> bool:
        """Serve in the background; False when the app failed to start (uvicorn logs why)."""
        self.serving = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        # uvicorn offers no startup event to wait on
        while not self._server.started and not self.serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self._server.started:  # uvicorn says this itself only for sockets it binds
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on %s (Press CTRL+C to quit)", self.url
            )
        return self._server.started

    async def stop(self) -> None:
        if self.serving is None:
            self._sock.close()
            return
        self._server.should_exit = True
        await self.serving


def _uvicorn_server(app: FastAPI, config: uvicorn.Config) -> uvicorn.Server:
    import uvicorn

    from gpu_share.coordinator.app import begin_shutdown

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the command handles signals: `up` stops its agent before the server

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            for server in self.servers:  # no new connections first (uvicorn repeats it)
                server.close()
            await begin_shutdown(app)
            await super().shutdown(sockets)

    return Server(config)
