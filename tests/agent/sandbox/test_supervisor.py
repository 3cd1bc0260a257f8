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


KILL_ALL = """
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("supervisor", sys.argv[1])
supervisor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(supervisor)
walks = []
walk = supervisor._descendants
supervisor._descendants = lambda root: walks.append(root) or walk(root)
supervisor.prctl(supervisor.PR_SET_CHILD_SUBREAPER, 1)
r, w = os.pipe()
leader = os.fork()
if leader == 0:
    if sys.argv[2] == "leaves-one" and os.fork() == 0:
        os.setsid()
        os.write(w, str(os.getpid()).encode())
        time.sleep(60)
        os._exit(0)
    os._exit(3)
os.close(w)
left = os.read(r, 20)
time.sleep(0.2)  # the leader has exited, not yet reaped
status = supervisor._kill_all(None, leader, None)
alive = bool(left) and os.path.exists(f"/proc/{int(left)}")
print(json.dumps([os.waitstatus_to_exitcode(status), len(walks), alive]))
"""


def test_a_job_leaving_nothing_costs_no_walk_of_proc_and_what_one_leaves_is_killed() -> None:
    """The teardown walks `/proc` for the job's processes only while a child is left: a job
    that leaves none costs no walk, and what one leaves (even in a session of its own)
    is found and killed, the leader's status kept."""

    def kill_all(case: str) -> list[object]:
        run = subprocess.run(
            [sys.executable, "-c", KILL_ALL, str(SUPERVISOR), case],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        answer: list[object] = json.loads(run.stdout)
        return answer

    assert kill_all("leaves-nothing") == [3, 0, False]
    status, walks, alive = kill_all("leaves-one")
    assert status == 3
    assert isinstance(walks, int) and walks >= 1
    assert alive is False
