"""The agent's one settings object; `GPUSHARE_AGENT_*` variables, read by the CLI only."""

from pathlib import Path

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
    keep_job_dirs: bool = False
    checkpoint_interval_sec: float = Field(
        default=60.0, gt=0, description="Training snapshots: how often to write and upload"
    )
    drain_timeout_sec: float = Field(
        default=30.0, ge=0, description="On stop, how long running jobs may finish"
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
