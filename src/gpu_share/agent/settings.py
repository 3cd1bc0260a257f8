"""The agent's one settings object; `GPUSHARE_AGENT_*` variables, read by the CLI only."""

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024
GiB = 1024 * MiB


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUSHARE_AGENT_", extra="ignore")

    server: str = Field(description="The coordinator's base URL")
    token: SecretStr | None = Field(
        default=None, description="Enrollment token (gpu_et_…); needed for the first start only"
    )
    data_dir: Path = Field(default=Path(".gpushare-agent"), description="Identity, cache, jobs")
    max_concurrent_jobs: int | None = Field(
        default=None, ge=1, le=256, description="Default: one per GPU, or 1 on a CPU node"
    )
    sandbox: str = Field(default="auto", pattern="^(auto|docker|bwrap|process)$")
    allow_unisolated: bool = Field(
        default=False,
        description="Run other tenants' jobs as plain processes (the process sandbox) when "
        "neither Docker nor bubblewrap works; without it such an agent refuses to start",
    )
    docker_image: str | None = None
    region: str | None = Field(default=None, max_length=64)
    cache_max_bytes: int = Field(default=20 * GiB, gt=0)
    max_download_bytes: int = Field(default=8 * GiB, gt=0)
    download_timeout_sec: float = Field(default=600.0, gt=0)
    lease_wait_sec: float = Field(default=20.0, ge=0, le=60)
    log_flush_interval_sec: float = Field(default=0.5, gt=0)
    allow_networks: list[str] = Field(
        default_factory=list,
        description="CIDRs jobs' URLs may point to although private (tests on loopback)",
    )
    job_threads: int | None = Field(default=None, ge=1, description="Threads per CPU job")
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: one JSON object per log line, with node and invoke"
    )
    keep_job_dirs: bool = False
    checkpoint_interval_sec: float = Field(
        default=60.0, gt=0, description="Training snapshots: how often to write and upload"
    )
    drain_timeout_sec: float = Field(
        default=30.0, ge=0, description="On stop, how long running jobs may finish"
    )
    benchmarks: bool = Field(
        default=True,
        description="Benchmark this node (docs/benchmarks.md): on its first start, every "
        "benchmark_interval_hours, and when an admin asks; false: never",
    )
    benchmark_interval_hours: float = Field(
        default=24.0, gt=0, le=24 * 365, description="How often the node benchmarks itself"
    )
    benchmark_quiet_sec: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="How long the node must have had no job and no session before a "
        "benchmark starts (work that arrives during one stops it)",
    )
    challenges: bool = Field(
        default=True,
        description="Answer the coordinator's hardware challenges (docs/trust.md): a GPU "
        "(or a CPU node) is verified, so rentable as its model, only once one passes; false: "
        "never, and the hardware stays unverified",
    )
    challenge_quiet_sec: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="How long challenged hardware must have been free of work before the "
        "challenge starts (it is offered to no new work meanwhile)",
    )
    warm_sandboxes: int = Field(
        default=2,
        ge=0,
        le=8,
        description="The most ONNX sandboxes kept started ahead of their job, per runtime "
        "and GPU (docs/sandbox.md): each is a fresh, isolated process that has imported its "
        "runtime and serves exactly one job, saving the ~250 ms start of an invoke. One "
        "waits per kind; another is added when jobs come faster than one starts. Each "
        "waiting one holds ~60–100 MB of memory; none start while free memory is short; "
        "0: none",
    )
    # What each job (and each session's model process) may use. The defaults give every
    # slot its share of the machine; see sandbox/limits.py for how each is enforced.
    job_memory_bytes: int | None = Field(
        default=None,
        ge=64 * MiB,
        description="Memory per job; default: total RAM × job_memory_fraction ÷ slots",
    )
    job_memory_fraction: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description="Share of the RAM all jobs together may use; the rest stays for the system",
    )
    job_cpus: float | None = Field(
        default=None, ge=0.01, description="CPU cores per job (a quota); default: cores ÷ slots"
    )
    job_max_processes: int = Field(
        default=256, ge=0, description="Processes and threads per job (a cgroup's); 0: no limit"
    )
    job_max_open_files: int = Field(default=1024, ge=0, description="Per job; 0: no limit")
    job_disk_bytes: int = Field(
        default=4 * GiB,
        ge=0,
        description="What a job may write to its folder (outputs, snapshots); 0: no limit",
    )
    max_inputs_expanded_bytes: int = Field(
        default=2 * GiB,
        ge=1 * MiB,
        description="MAX_INPUTS_EXPANDED_BYTES: the most a job's inputs NPZ (or a session "
        "forward's) may expand to, read from its headers before anything is inflated; "
        "past it, or past the job's memory, the job fails with RESOURCE_LIMIT",
    )
    job_cgroups: bool = Field(
        default=True,
        description="Enforce memory, CPU and processes with a cgroup per job where the agent "
        "can make one (as root); false: rlimits only",
    )

    @field_validator("server")
    @classmethod
    def _server(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL such as https://gpu-share.example")
        return value.rstrip("/")

    @property
    def identity_path(self) -> Path:
        return self.data_dir / "identity.json"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def warm_dir(self) -> Path:
        return self.data_dir / "warm"

    @property
    def benchmarks_dir(self) -> Path:
        return self.data_dir / "benchmarks"
