"""The supervisor: one small process on the host between the agent and each job.

Run as `python -I -S supervisor.py '<json>'` (see `process.start_supervised`); it
uses the standard library only, so it starts at once and nothing of the job's world
is imported. It

- becomes a child subreaper, so every process the job starts stays its descendant,
  even one that called setsid() or forked twice;
- forks the job: the child gets its own session, joins the job's cgroups, takes the
  job's rlimits and a parent-death signal, and execs the job's argv;
- waits until the job's main process exits, the agent asks it to stop (SIGTERM), or
  the agent dies (its lifeline pipe, whose other end only the agent holds, reads
  end-of-file) — then kills every process the job left (`cgroup.kill` where there is
  a v2 cgroup, and one by one in any case) and reaps them;
- reads which limits the kernel enforced (the cgroup counters it was given), removes
  the job's cgroups, so none outlives its job however the agent fares, and exits
  with the job's status, a death by signal N as 128+N, as bwrap reports it.

The status pipe carries one line when the job has started (`ok`, or why not) and,
at the end, the limits that were hit as a JSON list.

With `"watch"` in its config it runs no job: it waits for the agent to die and then
execs `on_agent_exit` (the Docker sandbox removes a container that way), or exits
quietly on SIGTERM.
"""

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CPU_GRACE_SEC = 5  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL this much later


class Stop(Exception):
    """The agent asked the job to stop."""


LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, used on both sides


def prctl(option: int, value: int) -> None:
    if LIBC.prctl(option, value, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def main(argv: list[str]) -> int:
    config: dict[str, Any] = json.loads(argv[1])
    if config.get("watch"):
        return watch(config)
    return supervise(config)


class _Asked:
    """Whether the agent asked the job to stop (SIGTERM). The handler only notes it, and
    the wakeup fd wakes the loop: an exception raised from the handler could land after
    the loop, or between a child's reaping and the note of its status, and end the
    supervisor with a traceback instead of the job's status."""

    to_stop = False


def _note_stop(signum: int, frame: object) -> None:
    _Asked.to_stop = True


def supervise(config: dict[str, Any]) -> int:
    status_fd: int = config["status_fd"]
    lifeline: int = config["lifeline_fd"]
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, _note_stop)

    exec_r, exec_w = os.pipe()  # close-on-exec: it reads EOF once the job's exec succeeded
    me = os.getpid()
    leader = os.fork()
    if leader == 0:
        _become_job(config, me, exec_w, (status_fd, lifeline, wakeup_r, wakeup_w, exec_r))
    os.close(exec_w)
    status: int | None = None
    agent_gone = False
    failure = _read_all(exec_r)
    if failure:
        os.waitpid(leader, 0)
        os.write(status_fd, failure)
        return 127
    os.write(status_fd, b"ok\n")
    while not _Asked.to_stop:
        status = _reap(leader)
        if status is not None:
            break
        ready, _, _ = select.select([wakeup_r, lifeline], [], [])
        if lifeline in ready:
            agent_gone = True  # nobody will read the result
            break
        _read_available(wakeup_r)
    # From here on it only cleans up and exits. The agent's SIGTERM may still be on its
    # way (it kills the job's processes first, which can end this loop before the signal
    # comes): held pending, so it cannot reach the interpreter's shutdown, which restores
    # the default action and would end this process with -15 instead of the job's status.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    status = _kill_all(config.get("cgroup_kill"), leader, status)
    hits = sorted(
        {limit for limit, path, key in config.get("cgroup_events", []) if _count(path, key)}
    )
    _remove_cgroups(config.get("cgroup_procs", []))
    if not agent_gone:
        with contextlib.suppress(OSError):
            os.write(status_fd, json.dumps(hits).encode() + b"\n")
    if status is None:
        return 128 + signal.SIGKILL
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _become_job(
    config: dict[str, Any], supervisor: int, exec_w: int, close: tuple[int, ...]
) -> None:
    try:
        for fd in close:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)  # as a fresh process has them
        os.setsid()
        for path in config.get("cgroup_procs", []):
            with open(path, "w") as procs:
                procs.write("0")
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != supervisor:  # it died before the line above took effect
            os._exit(128 + signal.SIGKILL)
        for name, value in config.get("rlimits", {}).items():
            _set_rlimit(name, int(value))
        argv: list[str] = config["argv"]
        os.execvp(argv[0], argv)  # noqa: S606 - the job's own argv, never through a shell
    except BaseException as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        os.write(exec_w, f"cannot start {config['argv'][0]}: {reason}".encode())
    os._exit(127)


def _set_rlimit(name: str, value: int) -> None:
    kind = getattr(resource, name)
    _, hard = resource.getrlimit(kind)
    if name == "RLIMIT_CPU":
        soft, new_hard = value, value + CPU_GRACE_SEC
    else:
        soft = new_hard = value
    if hard != resource.RLIM_INFINITY:  # never above what the agent itself may have
        soft, new_hard = min(soft, hard), min(new_hard, hard)
    resource.setrlimit(kind, (soft, new_hard))


def _stop(signum: int, frame: object) -> None:
    raise Stop


def _reap(leader: int) -> int | None:
    """Reap every child that has exited; the leader's wait status once it has."""
    status = None
    while True:
        try:
            pid, child_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == leader:
            status = child_status


def _kill_all(cgroup_kill: str | None, leader: int, status: int | None) -> int | None:
    """SIGKILL every descendant, again and again until none is left; returns the leader's
    wait status. As a subreaper, whatever a dying process leaves comes to us.

    With no child left, no descendant is left either (an orphan comes to us, so each one
    has a living ancestor among our children): then `/proc` is not walked. That is most
    jobs' end, and the walk costs ~2 ms of CPU on a machine of a few hundred processes."""
    if cgroup_kill:
        with contextlib.suppress(OSError), open(cgroup_kill, "w") as kill:
            kill.write("1")
    while True:
        try:
            pid, child_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid != 0:  # one more that had exited, reaped; look again
            if pid == leader:
                status = child_status
            continue
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            pid, child_status = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == leader:
            status = child_status


def _count(path: str, key: str) -> int:
    """One counter of a cgroup events file (`oom_kill 1`), 0 if it cannot be read."""
    try:
        with open(path) as events:
            for line in events:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def _remove_cgroups(procs_files: list[str]) -> None:
    """Remove the job's (now empty) cgroups; up to 5 s of retries while the kernel lets
    go (a v1 memory cgroup stays busy a while after its last process, longer on a
    loaded machine)."""
    for procs in procs_files:
        folder = os.path.dirname(procs)
        for _ in range(500):
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def watch(config: dict[str, Any]) -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        _read_all(config["lifeline_fd"])  # EOF: the agent exited, whichever way
    except Stop:
        return 0
    command: list[str] = config["on_agent_exit"]
    os.execvp(command[0], command)  # noqa: S606
    return 127


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_available(fd: int) -> None:
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


if __name__ == "__main__":
    # Everything is written, closed and reaped by now: the interpreter's teardown would
    # add ~5 ms to the end of every job, which the agent waits for (bench/README.md,
    # warm_invoke.py). A failure above still ends the normal way, with its traceback.
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
