"""`gpu-share agent` pointed at a server that is not there: a real agent process."""

import re
import time
from pathlib import Path

import pytest

from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

pytestmark = pytest.mark.slow


def test_an_agent_that_cannot_reach_its_server_says_so_backs_off_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    agent = AgentProcess(server, "gpu_et_never_used", tmp_path / "agent")
    attempt = re.compile(
        rf"cannot reach {re.escape(server)}: connection refused; retrying in (\S+) s$", re.M
    )
    try:
        deadline = time.monotonic() + 90
        while len(attempt.findall(agent.log)) < 3:
            assert agent.process.poll() is None, agent.log
            assert time.monotonic() < deadline, agent.log
            time.sleep(0.1)
    finally:
        code = agent.stop(timeout=30)
    log = agent.log
    assert code == 0, log
    assert [float(d) for d in attempt.findall(log)[:3]] == [1, 2, 4]  # one line per attempt
    assert "Traceback" not in log
    assert log.rstrip().endswith("stopped")
