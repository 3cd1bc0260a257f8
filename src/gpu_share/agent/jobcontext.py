"""What every job and session on this node shares, made once when the agent comes online.

Every process started through it runs inside the limits of one job (`job_limits()`: a
slot's share of the machine, unless the provider says otherwise), and it starts from a
clean jobs folder (`remove_leftovers()`: what a killed agent left).
"""

import logging
import os
import shutil
from dataclasses import dataclass

import psutil

from gpu_share.agent.cache import ArtifactCache
from gpu_share.agent.client import CoordinatorClient
from gpu_share.agent.gpu import Nvml
from gpu_share.agent.sandbox import JobLimits, LimitedSandbox, Sandbox
from gpu_share.agent.sandbox.cgroups import agent_cgroups
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.warm import WarmPool
from gpu_share.netguard import SafeFetcher

log = logging.getLogger(__name__)


@dataclass
class JobContext:
    """What every job on this node shares.

    Made once, when the agent comes online and before any job or session starts: it
    clears what an earlier run of this agent left (`remove_leftovers`) and wraps the
    sandbox so that every process started through it — a job's, a session's model
    process — runs inside `limits`.
    """

    settings: AgentSettings
    client: CoordinatorClient
    cache: ArtifactCache
    fetcher: SafeFetcher
    sandbox: Sandbox
    nvml: Nvml
    threads: int  # per job: the node's cores shared among its slots
    slots: int  # jobs at once on this node
    limits: JobLimits | None = None  # None: the settings' share of the machine per slot
    warm: WarmPool | None = None  # sandboxes started ahead of their job (`warm.py`)

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = job_limits(self.settings, self.slots)
        remove_leftovers(self.settings, self.sandbox)
        if not isinstance(self.sandbox, LimitedSandbox):
            self.sandbox = LimitedSandbox(self.sandbox, self.limits)


def job_limits(
    settings: AgentSettings,
    slots: int,
    *,
    total_memory: int | None = None,
    cores: int | None = None,
) -> JobLimits:
    """Each slot's share of the machine, where the provider has not set a limit itself."""
    if total_memory is None:
        total_memory = psutil.virtual_memory().total
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    memory = settings.job_memory_bytes or int(total_memory * settings.job_memory_fraction / slots)
    return JobLimits(
        memory_bytes=memory,
        cpus=settings.job_cpus or max(0.01, round(cores / slots, 2)),
        processes=settings.job_max_processes or None,
        open_files=settings.job_max_open_files or None,
        disk_bytes=settings.job_disk_bytes or None,
        cgroups=settings.job_cgroups,
    )


def remove_leftovers(settings: AgentSettings, sandbox: Sandbox) -> None:
    """Clear what an earlier run of this agent left when it was killed: job cgroups (with
    anything still in them), job containers, and job and session folders."""
    jobs_dir = settings.jobs_dir
    if not jobs_dir.is_dir():
        return
    cgroups = agent_cgroups(jobs_dir) if settings.job_cgroups else None
    if cgroups is not None and (removed := cgroups.remove_leftovers()):
        log.info("removed %d job cgroup(s) left by an earlier run", removed)
    remove = getattr(sandbox, "remove_leftovers", None)
    if remove is not None:
        remove(jobs_dir)
    if settings.keep_job_dirs:
        return
    leftovers = list(jobs_dir.iterdir())
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if leftovers:
        log.info("removed %d job folder(s) left by an earlier run", len(leftovers))
