"""Real agent processes for integration tests: start, stop, kill -9, pause."""

import os
import signal
import subprocess
import sys
from pathlib import Path


class AgentProcess:
    """`gpu-share agent` as a child process, its output in `<data_dir>/agent.log`.

    `allow_unisolated` passes `--allow-unisolated`; by default only with the process
    sandbox, which a test that asks for it means to get.
    """

    def __init__(
        self,
        server: str,
        token: str,
        data_dir: Path,
        *,
        sandbox: str = "bwrap",
        allow_networks: tuple[str, ...] = (),
        max_jobs: int = 1,
        allow_unisolated: bool | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "info",
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "agent.log"
        argv = [
            sys.executable,
            "-m",
            "gpu_share.cli.main",
            "agent",
            "--server",
            server,
            "--token",
            token,
            "--data-dir",
            str(data_dir),
            "--sandbox",
            sandbox,
            "--max-jobs",
            str(max_jobs),
            "--log-level",
            log_level,
        ]
        for cidr in allow_networks:
            argv += ["--allow-network", cidr]
        if allow_unisolated or (allow_unisolated is None and sandbox == "process"):
            argv.append("--allow-unisolated")
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "GPUSHARE_AGENT_LEASE_WAIT_SEC": "2",
                "GPUSHARE_AGENT_DRAIN_TIMEOUT_SEC": "1",
                # Tests that are not about benchmarks keep the CPU for what they test;
                # tests/e2e/test_benchmarks.py turns them on.
                "GPUSHARE_AGENT_BENCHMARKS": "0",
                # Hardware challenges likewise: tests/e2e/test_challenges.py turns them on.
                "GPUSHARE_AGENT_CHALLENGES": "0",
                **(env or {}),
            },
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """kill -9: no goodbye, no report."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.resume()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return self.process.returncode
