"""The supervisor itself (`sandbox/supervisor.py`), run as the agent runs it."""

import json
import os
import signal
import subprocess
import sys

from gpu_share.agent.sandbox.process import SUPERVISOR


def test_a_sigterm_arriving_as_the_supervisor_exits_does_not_change_its_status() -> None:
    """The agent kills a job's processes, then asks the supervisor to stop (SIGTERM); the
    supervisor may see the job die and be on its way out when the signal comes. It must
    still exit with the job's status, never die of the signal (-15)."""
    for _ in range(20):  # the signal lands at a different moment of the exit each time
        status_r, status_w = os.pipe()
        life_r, life_w = os.pipe()
        config = {"argv": ["true"], "status_fd": status_w, "lifeline_fd": life_r}
        supervisor = subprocess.Popen(
            [sys.executable, "-I", "-S", str(SUPERVISOR), json.dumps(config)],
            pass_fds=(status_w, life_r),
        )
        os.close(status_w)
        os.close(life_r)
        with os.fdopen(status_r, "rb") as status:
            assert status.readline() == b"ok\n"
            assert status.readline() == b"[]\n"  # the job is over: the supervisor is leaving
            supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0  # the job's status ("true"), not -15
        os.close(life_w)
