"""The coordinator's one settings object; read from `GPUSHARE_*` by the CLI only."""

from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpu_share.protocol.billing import BillingMode as BillingMode  # the type of `billing`

MiB = 1024 * 1024
GiB = 1024 * MiB
FRAME_HEADER_ALLOWANCE = 64 * 1024


class ChecksumMode(StrEnum):
    OFF = "off"
    WARN = "warn"
    ENFORCE = "enforce"


class SmtpSecurity(StrEnum):
    STARTTLS = "starttls"
    TLS = "tls"
    NONE = "none"  # only for a relay on the same host or a test server


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUSHARE_", extra="ignore")

    data_dir: Path = Field(default=Path(".gpushare"), description="Where embedded state lives")
    database_url: str = Field(
        default="",
        description="SQLAlchemy async URL; default: a SQLite file in data_dir",
    )
    artifact_dir: Path | None = Field(default=None, description="Default: data_dir/artifacts")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_base_url: str = Field(
        default="",
        description="How tenants and agents reach this server; default: from each request",
    )

    admin_key: SecretStr | None = Field(default=None, description="Admin key set at first start")
    key_cache_ttl_sec: float = Field(
        default=5.0, ge=0, description="How long a replica trusts a verified key (0: never)"
    )

    max_model_bytes: int = Field(default=64 * MiB, gt=0)
    max_config_bytes: int = Field(default=64 * MiB, gt=0)
    max_inputs_bytes: int = Field(default=512 * MiB, gt=0)
    tenant_quota_bytes: int = Field(default=10 * GiB, gt=0)
    artifact_ttl_sec: int = Field(default=24 * 3600, gt=0)
    artifact_sweep_interval_sec: float = Field(default=60.0, gt=0)

    checksum_mode: ChecksumMode = ChecksumMode.WARN

    heartbeat_interval_sec: float = Field(default=5.0, gt=0)
    node_offline_after_sec: float = Field(default=20.0, gt=0, description="Missed heartbeats")
    lease_ttl_sec: float = Field(default=30.0, gt=0, description="Extended by every heartbeat")
    lease_sweep_interval_sec: float = Field(default=2.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, description="Leases per invoke before it fails")
    max_timeout_sec: int = Field(default=6 * 3600, ge=1)
    max_lease_wait_sec: float = Field(default=25.0, ge=0)
    inline_output_limit_bytes: int = Field(default=1 * MiB, ge=0)
    max_output_bytes: int = Field(default=2 * GiB, gt=0)
    max_log_bytes_per_invoke: int = Field(default=2 * MiB, gt=0)
    artifact_token_ttl_sec: int = Field(default=3600, gt=0, description="Signed agent downloads")
    max_forward_bytes: int = Field(
        default=64 * MiB,
        gt=0,
        description="A session forward's body and its answer; a larger answer fails that "
        "forward alone (413)",
    )
    max_json_body_bytes: int = Field(
        default=1 * MiB, ge=1024, description="Any JSON request body, checked before anything else"
    )
    max_header_bytes: int = Field(default=32 * 1024, ge=4096, description="All request headers")
    session_sweep_interval_sec: float = Field(default=2.0, gt=0)
    url_allow_networks: list[str] = Field(
        default_factory=list,
        description="Private CIDRs probe-url may reach (tests on loopback); none by default",
    )

    rate_limit_applications: int = Field(
        default=10, ge=1, description="Applications per client address per hour"
    )
    rate_limit_failed_keys: int = Field(
        default=30, ge=1, description="Failed key lookups per client address per minute"
    )

    smtp_host: str = Field(
        default="",
        description="Where mail is sent; empty: mail stays in the outbox (admins read it)",
    )
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_username: str = ""
    smtp_password: SecretStr | None = None
    smtp_security: SmtpSecurity = SmtpSecurity.STARTTLS
    mail_from: str = Field(default="GPU Share <no-reply@localhost>", max_length=254)
    mail_interval_sec: float = Field(default=5.0, gt=0)

    reliability_interval_sec: float = Field(
        default=300.0, gt=0, description="How often reliability scores are recomputed"
    )

    billing: BillingMode = BillingMode.PREPAID
    commission_bps: int = Field(
        default=1_500, ge=0, le=5_000, description="The platform's share of each charge, in 1/100 %"
    )
    payout_minimum_micro: int = Field(
        default=10_000_000, ge=0, description="A weekly payout is made only above this (micro-USDC)"
    )
    payout_interval_sec: float = Field(
        default=3_600.0, gt=0, description="How often the payout loop looks for a due period"
    )

    sqlite_busy_timeout_ms: int = Field(default=10_000, ge=0)
    run_background_loops: bool = True

    @model_validator(mode="after")
    def _fill_defaults(self) -> "Settings":
        if not self.database_url:
            self.database_url = f"sqlite+aiosqlite:///{(self.data_dir / 'gpushare.db').resolve()}"
        if self.artifact_dir is None:
            self.artifact_dir = self.data_dir / "artifacts"
        self.public_base_url = self.public_base_url.rstrip("/")
        return self

    @property
    def websocket_max_bytes(self) -> int:
        """The largest frame the agents' channel takes: a forward or answer, and its header."""
        return self.max_forward_bytes + FRAME_HEADER_ALLOWANCE

    @property
    def artifacts_path(self) -> Path:
        assert self.artifact_dir is not None  # filled by the validator
        return self.artifact_dir

    def max_upload_bytes(self, kind: str) -> int:
        return {
            "model": self.max_model_bytes,
            "config": self.max_config_bytes,
            "inputs": self.max_inputs_bytes,
            "outputs": self.max_output_bytes,
            "checkpoint": self.max_output_bytes,
        }[kind]
