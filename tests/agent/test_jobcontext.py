"""The agent's side of limits: each slot's share by default, the provider's word above it,
every process started through the job context limited, and a dead run's leftovers gone."""

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from gpu_share.agent.cache import ArtifactCache
from gpu_share.agent.client import CoordinatorClient
from gpu_share.agent.gpu import Nvml
from gpu_share.agent.jobcontext import JobContext, job_limits, remove_leftovers
from gpu_share.agent.sandbox import JobLimits, LimitedSandbox, ProcessSandbox, SandboxSpec
from gpu_share.agent.sandbox.cgroups import agent_cgroups
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.worker import Agent
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol.runtimes import RuntimeName
from tests.agent.test_gpu import FakeNvml

GiB = 1024**3
MiB = 1024**2


def settings(tmp_path: Path, **fields: Any) -> AgentSettings:
    return AgentSettings(server="http://127.0.0.1:9", data_dir=tmp_path / "agent", **fields)


def test_each_slot_gets_its_share_of_the_machine_by_default(tmp_path: Path) -> None:
    limits = job_limits(settings(tmp_path), slots=4, total_memory=16 * GiB, cores=8)
    assert limits == JobLimits(
        memory_bytes=3 * GiB,  # 16 GiB × 0.75 ÷ 4
        cpus=2.0,
        processes=256,
        open_files=1024,
        disk_bytes=4 * GiB,
    )


def test_the_providers_settings_replace_the_share_and_zero_means_no_limit(tmp_path: Path) -> None:
    chosen = settings(
        tmp_path,
        job_memory_bytes=512 * MiB,
        job_cpus=0.5,
        job_max_processes=0,
        job_max_open_files=64,
        job_disk_bytes=0,
        job_cgroups=False,
    )
    assert job_limits(chosen, slots=1, total_memory=64 * GiB, cores=32) == JobLimits(
        memory_bytes=512 * MiB, cpus=0.5, open_files=64, cgroups=False
    )
    fraction = settings(tmp_path, job_memory_fraction=0.5)
    assert job_limits(fraction, slots=3, total_memory=12 * GiB, cores=2).memory_bytes == 2 * GiB
    assert job_limits(fraction, slots=3, total_memory=12 * GiB, cores=2).cpus == 0.67


async def test_every_process_started_through_the_job_context_runs_inside_the_limits(
    tmp_path: Path,
) -> None:
    """A session's model process brings no limits of its own; the context's apply to it."""
    agent = settings(tmp_path, job_max_open_files=77, job_disk_bytes=3 * MiB)
    agent.jobs_dir.mkdir(parents=True, mode=0o700)
    async with SafeFetcher(UrlPolicy.from_strings([])) as fetcher:
        ctx = JobContext(
            agent,
            CoordinatorClient(agent.server),
            ArtifactCache(agent.cache_dir, GiB),
            fetcher,
            ProcessSandbox(),
            Nvml(module=None),
            threads=1,
            slots=2,
        )
        assert isinstance(ctx.sandbox, LimitedSandbox) and ctx.sandbox.name == "process"
        assert ctx.limits is not None and ctx.limits.open_files == 77
        folder = agent.jobs_dir / "ses_x"
        folder.mkdir()
        code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
        process = await ctx.sandbox.start(
            SandboxSpec(argv=[sys.executable, "-c", code], job_dir=folder, inputs={}, env={})
        )
        output = await asyncio.wait_for(process.stdout.read(), 30)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert output.decode().strip() == "77"
        await ctx.client.aclose()


def test_what_a_killed_agent_left_is_removed_when_it_comes_back(tmp_path: Path) -> None:
    agent = settings(tmp_path)
    jobs = agent.jobs_dir
    (jobs / "inv_1-1" / "out").mkdir(parents=True, mode=0o700)
    (jobs / "inv_1-1" / "out" / "outputs.npz").write_bytes(b"x" * 1024)
    (jobs / "inv_1-1.staging").mkdir()
    (jobs / "ses_2" / "in").mkdir(parents=True)
    survivor = None
    cgroups = agent_cgroups(jobs)
    if cgroups is not None:  # a job of the dead agent, still running in its cgroup
        leftover = cgroups.create("inv_1-1.dead", memory_bytes=GiB, processes=64, cpus=None)
        survivor = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: join(leftover.procs_files))
    try:
        remove_leftovers(agent, ProcessSandbox())
        assert list(jobs.iterdir()) == []
        if survivor is not None:
            assert survivor.wait(30) == -signal.SIGKILL
            assert cgroups is not None and cgroups.remove_leftovers() == 0
            assert not any(Path(procs).parent.exists() for procs in leftover.procs_files)
    finally:
        if survivor is not None and survivor.poll() is None:
            survivor.kill()


def join(procs_files: list[str]) -> None:
    for procs in procs_files:
        with open(procs, "w") as f:
            f.write("0")


def test_job_folders_are_kept_when_the_provider_keeps_them(tmp_path: Path) -> None:
    agent = settings(tmp_path, keep_job_dirs=True)
    (agent.jobs_dir / "inv_1-1").mkdir(parents=True)
    remove_leftovers(agent, ProcessSandbox())
    assert [p.name for p in agent.jobs_dir.iterdir()] == ["inv_1-1"]


def test_the_inventory_reports_the_memory_each_job_may_use(tmp_path: Path) -> None:
    """What the offers show (`memory_limit_mb`): the slot's share by default, else the
    provider's limit, as the jobs will be limited."""
    total = psutil.virtual_memory().total

    def agent(**fields: Any) -> Agent:
        return Agent(
            settings(tmp_path, benchmarks=False, **fields),
            sandbox=ProcessSandbox(),
            nvml=Nvml(FakeNvml(count=4)),  # type: ignore[arg-type]
            runtimes=[RuntimeName.ONNX_CPU],
        )

    shared = agent().inventory()
    assert shared.max_concurrent_jobs == 4
    assert shared.job_memory_mb == int(total * 0.75 / 4) // MiB
    assert agent(max_concurrent_jobs=2).inventory().job_memory_mb == int(total * 0.75 / 2) // MiB
    assert agent(job_memory_bytes=3 * GiB).inventory().job_memory_mb == 3 * 1024
