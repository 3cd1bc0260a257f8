"""Every job runs inside its limits, proven with real jobs in bwrap and in plain processes.

Memory, CPU and processes go through a cgroup per job wherever the agent can make one
(as root, which these tests and CI are) and through rlimits where it cannot
(`JobLimits(cgroups=False)` forces that here); open files and disk are the same
everywhere. A job past a limit is ended and `limit_hit` names the limit; its
neighbours run on. When the agent dies, even by `kill -9`, its jobs die with it.
"""

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpu_share.agent.sandbox import JobLimits, ProcessSandbox, Sandbox, SandboxSpec
from gpu_share.agent.sandbox.bwrap import detect_bwrap
from gpu_share.agent.sandbox.cgroups import agent_cgroups
from gpu_share.agent.sandbox.limits import DiskWatch

REQUIRE_BWRAP = os.environ.get("GPUSHARE_REQUIRE_BWRAP") == "1"
MiB = 1024 * 1024
ROOT = os.geteuid() == 0


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Iterator[Path]:
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o700)
    yield jobs
    if (cgroups := agent_cgroups(jobs)) is not None:
        assert cgroups.remove_leftovers() == 0  # each job's cgroup went with it


@pytest.fixture(params=["bwrap", "process"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "process":
        return ProcessSandbox()
    try:
        return detect_bwrap()
    except Exception as exc:
        if REQUIRE_BWRAP:
            pytest.fail(f"GPUSHARE_REQUIRE_BWRAP=1 but {exc}")
        pytest.skip(str(exc))


def controllers(jobs_dir: Path) -> frozenset[str]:
    cgroups = agent_cgroups(jobs_dir)
    return cgroups.controllers if cgroups is not None else frozenset()


def needs_cgroup(jobs_dir: Path, controller: str) -> None:
    if controller not in controllers(jobs_dir):
        pytest.skip(f"this machine lets the agent make no cgroup with {controller}")


def job(jobs_dir: Path, code: str, limits: JobLimits, name: str = "job") -> SandboxSpec:
    folder = jobs_dir / name
    folder.mkdir(exist_ok=True)
    return SandboxSpec(
        argv=[sys.executable, "-c", textwrap.dedent(code)],
        job_dir=folder,
        inputs={},
        env={},
        limits=limits,
    )


async def run(sandbox: Sandbox, spec: SandboxSpec) -> tuple[int, str, Any]:
    process = await sandbox.start(spec)
    output = await asyncio.wait_for(process.stdout.read(), 60)
    status = await asyncio.wait_for(process.wait(), 60)
    return status, output.decode(errors="replace"), process.limit_hit


ALLOCATE = """
import numpy
block = numpy.ones({size}, dtype=numpy.uint8)  # touched: resident, not just reserved
print("allocated", flush=True)
"""


async def test_a_job_past_its_memory_is_ended_and_the_message_names_the_limit(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    needs_cgroup(jobs_dir, "memory")
    limits = JobLimits(memory_bytes=160 * MiB)
    status, output, hit = await run(sandbox, job(jobs_dir, ALLOCATE.format(size=600 * MiB), limits))
    assert status == -signal.SIGKILL and "allocated" not in output
    assert hit is not None and hit.limit == "memory"
    assert "the job used more than its 160 MiB of memory" in hit.message


async def test_without_a_cgroup_memory_is_an_rlimit_and_the_allocation_fails(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    code = """
    import resource
    print("data limit", resource.getrlimit(resource.RLIMIT_DATA)[0], flush=True)
    import numpy
    try:
        numpy.ones(600 * 1024 * 1024, dtype=numpy.uint8)
    except MemoryError:
        print("refused", flush=True)
    """
    limits = JobLimits(memory_bytes=200 * MiB, cgroups=False)
    status, output, hit = await run(sandbox, job(jobs_dir, code, limits))
    assert status == 0, output
    assert f"data limit {200 * MiB}" in output and "refused" in output
    assert hit is None  # the runtime says so itself: see the runtime tests


async def test_a_job_next_to_one_past_its_memory_runs_on(sandbox: Sandbox, jobs_dir: Path) -> None:
    needs_cgroup(jobs_dir, "memory")
    limits = JobLimits(memory_bytes=160 * MiB)
    greedy = job(jobs_dir, ALLOCATE.format(size=600 * MiB), limits, "greedy")
    modest = job(jobs_dir, ALLOCATE.format(size=16 * MiB), limits, "modest")
    (
        (greedy_status, _, greedy_hit),
        (modest_status, modest_output, modest_hit),
    ) = await asyncio.gather(run(sandbox, greedy), run(sandbox, modest))
    assert greedy_status == -signal.SIGKILL and greedy_hit is not None
    assert (modest_status, modest_hit) == (0, None) and "allocated" in modest_output


FORK_MANY = """
import os, time
started = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as exc:
        print("refused", type(exc).__name__, "after", started, flush=True)
        raise SystemExit(3)
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    started += 1
print("all started", flush=True)
"""


async def test_a_job_cannot_run_more_processes_than_its_limit(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    needs_cgroup(jobs_dir, "pids")
    limits = JobLimits(processes=24)
    status, output, hit = await run(sandbox, job(jobs_dir, FORK_MANY, limits))
    assert status == 3 and "refused BlockingIOError" in output, output
    assert int(output.split("after")[1]) < 24
    assert hit is not None and hit.limit == "processes"
    assert "more than 24 processes and threads" in hit.message


async def test_open_files_stop_at_the_limit(sandbox: Sandbox, jobs_dir: Path) -> None:
    code = """
    import errno
    held = []
    try:
        while len(held) < 1000:
            held.append(open("/dev/null"))
    except OSError as exc:
        print("refused", errno.errorcode[exc.errno], "holding", len(held), flush=True)
    """
    status, output, _ = await run(sandbox, job(jobs_dir, code, JobLimits(open_files=64)))
    assert status == 0 and "refused EMFILE" in output, output
    assert int(output.split("holding")[1]) < 64


WRITE_FILES = """
import time
for i in range({count}):
    with open(f"out-{{i}}.bin", "wb") as f:
        f.write(b"x" * (1024 * 1024))
print("written", flush=True)
{then}
"""


async def test_a_job_writing_past_its_disk_limit_is_killed(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    code = WRITE_FILES.format(count=40, then="time.sleep(600)")
    status, _, hit = await run(sandbox, job(jobs_dir, code, JobLimits(disk_bytes=8 * MiB)))
    assert status == -signal.SIGKILL
    assert hit is not None and hit.limit == "disk"
    assert "more than its 8 MiB of disk" in hit.message


async def test_a_job_that_ends_past_its_disk_limit_is_caught_when_it_ends(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    code = WRITE_FILES.format(count=12, then="")
    status, output, hit = await run(sandbox, job(jobs_dir, code, JobLimits(disk_bytes=8 * MiB)))
    assert status == 0 and "written" in output
    assert hit is not None and hit.limit == "disk"


async def test_one_file_cannot_grow_past_the_disk_limit(sandbox: Sandbox, jobs_dir: Path) -> None:
    code = """
    try:
        with open("big.bin", "wb") as f:
            f.write(b"x" * (16 * 1024 * 1024))
    except OSError as exc:
        print("refused:", exc.strerror, flush=True)
    """
    status, output, _ = await run(sandbox, job(jobs_dir, code, JobLimits(disk_bytes=4 * MiB)))
    assert status == 0 and "refused: File too large" in output, output


async def test_inputs_placed_by_the_agent_do_not_count_against_the_disk_limit(
    jobs_dir: Path, tmp_path: Path
) -> None:
    big_input = tmp_path / "cached-input"
    big_input.write_bytes(b"i" * (12 * MiB))
    code = "print(len(open('in/inputs', 'rb').read()))"
    spec = replace(job(jobs_dir, code, JobLimits(disk_bytes=4 * MiB)), inputs={"inputs": big_input})
    status, output, hit = await run(ProcessSandbox(), spec)  # the process sandbox copies them
    assert (status, output.strip(), hit) == (0, str(12 * MiB), None)


def test_disk_use_counts_growth_of_what_was_there_and_each_link_once(tmp_path: Path) -> None:
    (tmp_path / "input").write_bytes(b"i" * MiB)
    watch = DiskWatch(tmp_path, limit=3 * MiB)
    with (tmp_path / "input").open("ab") as grown:
        grown.write(b"g" * MiB)
    (tmp_path / "new").write_bytes(b"n" * MiB)
    os.link(tmp_path / "new", tmp_path / "same")
    with (tmp_path / "sparse").open("wb") as sparse:
        sparse.truncate(MiB)  # no blocks, but the agent would copy every byte of it
    assert watch.written() == 3 * MiB
    assert watch.exceeded() is None
    (tmp_path / "one-more").write_bytes(b"!")
    assert watch.exceeded() is not None


async def test_without_a_cgroup_cpu_time_is_its_share_of_the_timeout(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    spin = "while True:\n    pass\n"
    limits = JobLimits(cpus=0.5, wall_sec=2, cgroups=False)
    status, _, hit = await run(sandbox, job(jobs_dir, spin, limits))
    assert status == -signal.SIGXCPU
    assert hit is not None and hit.limit == "cpu"
    assert "more than its 1 CPU-seconds (0.5 CPUs" in hit.message


async def test_a_job_gets_a_cgroup_of_its_own_with_its_cpu_quota(jobs_dir: Path) -> None:
    needs_cgroup(jobs_dir, "cpu")
    code = "import time\nprint(open('/proc/self/cgroup').read(), flush=True)\ntime.sleep(60)\n"
    process = await ProcessSandbox().start(job(jobs_dir, code, JobLimits(cpus=0.5)))
    try:
        lines = (await asyncio.wait_for(process.stdout.readuntil(b"\n\n"), 30)).decode()
        quotas = [
            cpu_quota(hierarchy, path)
            for _, hierarchy, path in (line.split(":", 2) for line in lines.split())
            if hierarchy in ("", "cpu") or "cpu" in hierarchy.split(",")
        ]
        assert "0.5" in quotas, lines
    finally:
        process.kill()
        await process.wait()


def cpu_quota(hierarchy: str, path: str) -> str | None:
    """The CPUs a cgroup's quota allows, from its v2 `cpu.max` or its v1 CFS files."""
    if hierarchy == "":
        for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            cpu_max = Path(mount, path.lstrip("/"), "cpu.max")
            if cpu_max.exists():
                allowed, period = cpu_max.read_text().split()
                return f"{int(allowed) / int(period):g}"
        return None
    folder = Path("/sys/fs/cgroup", hierarchy, path.lstrip("/"))
    quota_us = int((folder / "cpu.cfs_quota_us").read_text())
    period_us = int((folder / "cpu.cfs_period_us").read_text())
    return f"{quota_us / period_us:g}"


AGENT = """
import asyncio, sys
from pathlib import Path
from gpu_share.agent.sandbox import JobLimits, ProcessSandbox, SandboxSpec
from gpu_share.agent.sandbox.bwrap import detect_bwrap

async def main() -> None:
    sandbox = detect_bwrap() if sys.argv[1] == "bwrap" else ProcessSandbox()
    spec = SandboxSpec(
        argv=[sys.executable, "-c", sys.argv[3]],
        job_dir=Path(sys.argv[2]),
        inputs={},
        env={},
        limits=JobLimits(memory_bytes=512 * 1024 * 1024, processes=64),
    )
    job = await sandbox.start(spec)
    print((await job.stdout.readline()).decode().strip(), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

LEAVE_BEHIND = """
import os, subprocess, time
subprocess.Popen(["sleep", "{token}"])
subprocess.Popen(["sleep", "{token}"], start_new_session=True)
if os.fork() == 0:  # a daemon: setsid, fork again, the middle one exits
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{token}"])
    os._exit(0)
while len([p for p in os.listdir("/proc") if p.isdigit() and _is_sleeper(p)]) < 3:
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(600)
"""

IS_SLEEPER = """
def _is_sleeper(pid):
    try:
        return open(f"/proc/{{pid}}/cmdline", "rb").read() == b"sleep\\x00{token}\\x00"
    except OSError:
        return False
"""


def sleepers(token: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["cmdline"] == ["sleep", token] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def cgroups_gone(jobs_dir: Path, within: float = 30.0) -> bool:
    """No cgroup of this agent's jobs is left (True at once where it makes none)."""
    if (cgroups := agent_cgroups(jobs_dir)) is None:
        return True
    parents = [folder for folder in (cgroups.unified, *cgroups.v1.values()) if folder is not None]

    def left() -> list[Path]:
        return [job for parent in parents for job in parent.glob(f"{cgroups.prefix}*")]

    deadline = time.monotonic() + within
    while left() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not left()


async def gone(token: str, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while sleepers(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not sleepers(token)


async def test_kill_9_of_the_agent_ends_its_jobs_and_all_they_started(
    sandbox: Sandbox, jobs_dir: Path
) -> None:
    token = str(600_000_000 + secrets.randbelow(99_999_999))
    folder = jobs_dir / "job"
    folder.mkdir()
    code = IS_SLEEPER.format(token=token) + LEAVE_BEHIND.format(token=token)
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, sandbox.name, str(folder), code],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        assert await asyncio.to_thread(agent.stdout.readline) == "ready\n"
        assert len(sleepers(token)) == 3  # one child, one in its own session, one daemon
        agent.kill()
        agent.wait(10)
        assert await gone(token)
        assert await cgroups_gone(jobs_dir)  # the supervisor removes them before it exits
    finally:
        agent.kill()
        agent.wait(10)
        for pid in sleepers(token):
            os.kill(pid, signal.SIGKILL)
