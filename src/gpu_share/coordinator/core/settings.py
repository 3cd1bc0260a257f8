"""The coordinator's one settings object; read from `GPUSHARE_*` by the CLI only."""

import ipaddress
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpu_share.protocol.bank_regions import region_countries
from gpu_share.protocol.billing import BillingMode as BillingMode  # the type of `billing`
from gpu_share.protocol.payouts import bic_text, iban_text, solana_address

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
    storage: Literal["local", "s3"] = Field(
        default="local",
        description="Where artifact bytes live: artifact_dir, or an S3-compatible bucket",
    )
    s3_bucket: str = Field(default="", description="The bucket, with storage=s3")
    s3_endpoint_url: str = Field(
        default="", description="An S3-compatible service's address (MinIO, R2…); default: AWS"
    )
    s3_public_endpoint_url: str = Field(
        default="",
        description="The store's address as agents reach it, when not s3_endpoint_url",
    )
    s3_region: str = Field(default="", description="Default: AWS_REGION, else us-east-1")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_base_url: str = Field(
        default="",
        description="How tenants and agents reach this server; default: from each request",
    )

    relay_host: str = Field(
        default="",
        description="Where this process takes session traffic its peers relay to it "
        "(several workers or replicas); empty: none, sessions answer only where they are",
    )
    relay_port: int = Field(default=0, ge=0, le=65535, description="0: any free port")
    relay_advertise_host: str = Field(
        default="", description="The address peers reach the relay at; default: relay_host"
    )

    admin_key: SecretStr | None = Field(default=None, description="Admin key set at first start")
    key_cache_ttl_sec: float = Field(
        default=5.0, ge=0, description="How long a replica trusts a verified key (0: never)"
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="A bearer token Prometheus scrapes /metrics with (an admin key works too)",
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: one JSON object per log line, with request ids"
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
    enrollment_token_days: int = Field(
        default=7,
        ge=1,
        le=365,
        description="How long a new enrollment token registers machines (the admin may "
        "choose another lifetime when issuing one); nodes already registered keep working",
    )
    lease_ttl_sec: float = Field(default=30.0, gt=0, description="Extended by every heartbeat")
    lease_sweep_interval_sec: float = Field(default=2.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, description="Leases per invoke before it fails")
    preemption_grace_sec: float = Field(
        default=10.0,
        ge=0,
        description="How long queued on-demand work waits before it may stop spot work",
    )
    preemption_cooldown_sec: float = Field(
        default=600.0,
        ge=0,
        description="After canceling work placed for a preemption, how long a tenant's work "
        "stops no spot work",
    )
    max_timeout_sec: int = Field(default=6 * 3600, ge=1)
    max_lease_wait_sec: float = Field(default=25.0, ge=0)
    claims_at_once: int = Field(
        default=4,
        ge=1,
        description="Claims one process runs at once; other lease requests wait in memory, "
        "holding no database connection (docs/deployment.md, Sizing)",
    )
    db_pool_size: int = Field(
        default=10,
        ge=1,
        description="PostgreSQL connections one process keeps open (docs/deployment.md, Sizing)",
    )
    db_max_overflow: int = Field(
        default=20,
        ge=0,
        description="More PostgreSQL connections one process opens under load, each closed "
        "when it is given back while the pool is full",
    )
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
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses or networks of the reverse proxies whose X-Forwarded-For "
        "names the client (comma-separated); none by default",
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
    demo_money: bool = Field(
        default=False,
        description="`gpu-share up`: the demo tenant's balance and the local node's price "
        "are demo money, and the consoles say so (prepaid billing only)",
    )
    commission_bps: int = Field(
        default=1_500, ge=0, le=5_000, description="The platform's share of each charge, in 1/100 %"
    )
    payout_minimum_micro: int = Field(
        default=10_000_000, ge=0, description="A weekly payout is made only above this (micro-USDC)"
    )
    payout_interval_sec: float = Field(
        default=3_600.0, gt=0, description="How often the payout loop looks for a due period"
    )
    earnings_hold_days: int = Field(
        default=7,
        ge=0,
        le=365,
        description="Days a charge's earnings are held before they are payable (docs/payouts.md)",
    )
    earnings_hold_days_enterprise: int = Field(
        default=2,
        ge=0,
        le=365,
        description="The hold for an Enterprise provider's charges earned on verified hardware",
    )
    earnings_release_interval_sec: float = Field(
        default=300.0, gt=0, description="How often held earnings whose hold passed are released"
    )

    # Hardware challenges (docs/trust.md, "Hardware challenges").
    challenge_target_sec: float = Field(
        default=4.0, gt=0, le=600, description="What a challenge's chain takes at the claimed rate"
    )
    challenge_allowance_sec: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Added to each deadline: the round trip, setting up, copying rows out",
    )
    challenge_efficiency_floor: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description="The least share of the claimed rate that meets the deadline: each "
        "deadline is allowance + target ÷ floor",
    )
    challenge_samples: int = Field(
        default=6, ge=1, le=8, description="Chunks of the chain a node must reveal"
    )
    challenge_memory_share: float = Field(
        default=0.15, gt=0, le=0.5, description="Share of the claimed memory the state fills"
    )
    challenge_recheck_min_days: float = Field(
        default=3.0, gt=0, description="A pass is challenged again at a random time after this"
    )
    challenge_recheck_max_days: float = Field(default=10.0, gt=0, description="…and before this")
    challenge_retry_sec: float = Field(
        default=3600.0, ge=0, description="After a failure, the next challenge waits this long"
    )
    challenge_start_within_sec: float = Field(
        default=86_400.0,
        gt=0,
        description="A challenge the node never starts expires after this (a failure)",
    )
    challenge_interval_sec: float = Field(
        default=30.0, gt=0, description="How often challenges are issued and overdue ones ended"
    )
    challenge_scale: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Shrinks every challenge's work and memory (tests); 1 in production",
    )

    # Spot checks of results on trusted nodes (docs/trust.md, "Spot checks").
    spot_check_interval_sec: float = Field(
        default=10.0, gt=0, description="How often ended jobs are picked and checks concluded"
    )
    spot_check_start_rate: float = Field(
        default=0.5, gt=0, le=1, description="The share of a new node's jobs checked"
    )
    spot_check_floor_rate: float = Field(
        default=0.03,
        ge=0.025,
        le=1,
        description="The least share checked, however long the clean record "
        "(1 - 0.97^200: 99.8 % of nodes that turn to cheating are caught within 200 jobs)",
    )
    spot_check_halving_matches: int = Field(
        default=10, ge=1, description="Consecutive matches that halve a node's rate"
    )
    spot_check_decide_within_sec: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="A job that ended longer ago than this is no longer picked for a check",
    )
    spot_check_wait_sec: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="A check no trusted node took by then is dropped as inconclusive",
    )
    spot_check_max_output_bytes: int = Field(
        default=256 * MiB, gt=0, description="Outputs larger than this are not compared"
    )
    spot_check_rtol_fp32: float = Field(default=1e-2, gt=0, lt=1)
    spot_check_atol_fp32: float = Field(
        default=1e-2, gt=0, lt=1, description="Of the largest magnitude in the trusted array"
    )
    spot_check_rtol_fp16: float = Field(default=5e-2, gt=0, lt=1)
    spot_check_atol_fp16: float = Field(default=5e-2, gt=0, lt=1)
    spot_check_rtol_bf16: float = Field(default=1e-1, gt=0, lt=1)
    spot_check_atol_bf16: float = Field(default=1e-1, gt=0, lt=1)
    spot_check_rtol_fp64: float = Field(default=1e-6, gt=0, lt=1)
    spot_check_atol_fp64: float = Field(default=1e-6, gt=0, lt=1)
    spot_check_outlier_share: float = Field(
        default=0.01,
        ge=0,
        lt=0.5,
        description="Elements of an array that may differ beyond tolerance (near-ties "
        "of argmax and thresholds), as a share; integers may differ in 2 more",
    )
    spot_check_metric_rtol: float = Field(
        default=1e-3, gt=0, lt=1, description="CatBoost: a reported metric against its re-score"
    )
    spot_check_timeout_margin: float = Field(
        default=4.0,
        ge=1,
        description="A TIMEOUT counts against a node only if the trusted node finished in "
        "this fraction of the timeout, after scaling by how much faster it is",
    )
    spot_check_memory_margin: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="An OUT_OF_MEMORY counts against a node only if the trusted node needed "
        "at most this share of the memory the node had for the job",
    )
    trusted_min_checks: int = Field(
        default=200, ge=1, description="Clean checks that make a verified Enterprise node trusted"
    )
    trusted_min_reliability: float = Field(default=0.95, ge=0, le=1)

    webhook_interval_sec: float = Field(
        default=2.0, gt=0, description="How often due webhook deliveries are sent"
    )
    webhook_timeout_sec: float = Field(
        default=10.0, gt=0, le=60, description="How long one webhook attempt may take"
    )
    webhook_retry_hours: float = Field(
        default=24.0,
        gt=0,
        le=24 * 7,
        description="How long a webhook that is not answered 2xx is retried before it fails",
    )
    bank_payout_regions: Annotated[list[str], NoDecode] = Field(
        default=["SEPA"],
        description="Where bank payouts may go: SEPA (its countries) and/or country codes "
        "inside it, comma-separated; empty turns bank payouts off",
    )
    sepa_debtor_name: str = Field(
        default="", max_length=70, description="The platform's bank account holder, for pain.001"
    )
    sepa_debtor_iban: str = Field(default="", description="The account bank payouts leave from")
    sepa_debtor_bic: str = Field(default="", description="Its bank's BIC (8 or 11 characters)")

    @field_validator("bank_payout_regions", mode="before")
    @classmethod
    def _bank_regions(cls, value: object) -> object:
        entries = value.split(",") if isinstance(value, str) else value
        if not isinstance(entries, list | tuple):
            return value
        named = [str(entry).strip().upper() for entry in entries if str(entry).strip()]
        region_countries(named)  # ValueError names an unknown region
        return named

    @field_validator("sepa_debtor_iban")
    @classmethod
    def _debtor_iban(cls, value: str) -> str:
        return iban_text(value) if value.strip() else ""

    @field_validator("sepa_debtor_bic")
    @classmethod
    def _debtor_bic(cls, value: str) -> str:
        return bic_text(value) if value.strip() else ""

    # USDC payouts sent by the platform on Solana (docs/payouts.md, "Payouts on Solana"):
    # on only when both the RPC URL and a payout keypair are set.
    solana_rpc_url: SecretStr | None = Field(
        default=None,
        description="The Solana JSON-RPC endpoint, such as https://api.mainnet-beta.solana.com "
        "(secret: a provider's URL carries its API key)",
    )
    solana_usdc_mint: str = Field(
        default="EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
        description="The USDC mint (the default is mainnet's)",
    )
    solana_payout_keypair_path: Path | None = Field(
        default=None, description="The payout keypair, a solana-keygen JSON file"
    )
    solana_payout_keypair: SecretStr | None = Field(
        default=None, description="Or the keypair itself (its JSON, or base58), from a secret store"
    )
    solana_commitment: str = Field(
        default="confirmed",
        pattern="^(processed|confirmed|finalized)$",
        description="For blockhashes and preflight; a payout is paid only once finalized",
    )
    solana_explorer_url: str = Field(
        default="https://explorer.solana.com/tx/{signature}",
        pattern=r"\{signature\}",
        description="The explorer link providers see; add ?cluster=devnet for devnet",
    )
    solana_payout_max_micro: int = Field(
        default=5_000_000_000, ge=0, description="A larger payout waits for an admin's approval"
    )
    solana_payout_daily_max_micro: int = Field(
        default=50_000_000_000,
        ge=0,
        description="Payouts past this total per UTC day wait for an admin's approval",
    )
    solana_interval_sec: float = Field(
        default=10.0, gt=0, description="How often the chain payout loop sends and follows"
    )
    solana_rpc_timeout_sec: float = Field(default=10.0, gt=0)
    solana_rpc_attempts: int = Field(default=3, ge=1, le=10)
    solana_rpc_retry_first_sec: float = Field(default=0.5, ge=0)
    solana_send_claim_sec: float = Field(
        default=120.0, gt=0, description="A replica sending a payout holds it this long at most"
    )
    # Tenants' USDC top-ups (docs/billing.md, "Top up with USDC"): on when the RPC URL and
    # the deposit wallet are set.
    solana_deposit_wallet: str | None = Field(
        default=None,
        description="The platform's wallet (public key) whose USDC account receives top-ups",
    )
    solana_deposit_ttl_sec: float = Field(
        default=24 * 3600.0, gt=0, description="How long a deposit request is watched"
    )
    solana_deposit_interval_sec: float = Field(
        default=15.0, gt=0, description="How often open deposit requests are looked up"
    )

    @field_validator("solana_deposit_wallet", "solana_usdc_mint")
    @classmethod
    def _solana_key(cls, value: str | None) -> str | None:
        return solana_address(value) if value else value

    sqlite_busy_timeout_ms: int = Field(default=10_000, ge=0)
    run_background_loops: bool = True

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_networks(cls, value: object) -> object:
        """A comma-separated variable, or a list; each entry an address or a network."""
        entries = value.split(",") if isinstance(value, str) else value
        if not isinstance(entries, list | tuple):
            return value
        named = [str(entry).strip() for entry in entries]
        return [str(ipaddress.ip_network(entry, strict=False)) for entry in named if entry]

    @model_validator(mode="after")
    def _fill_defaults(self) -> "Settings":
        if not self.database_url:
            self.database_url = f"sqlite+aiosqlite:///{(self.data_dir / 'gpushare.db').resolve()}"
        if self.artifact_dir is None:
            self.artifact_dir = self.data_dir / "artifacts"
        self.public_base_url = self.public_base_url.rstrip("/")
        if self.storage == "s3":
            self._check_s3()
        if self.relay_host in ("0.0.0.0", "::") and not self.relay_advertise_host:  # noqa: S104
            raise ValueError(
                "GPUSHARE_RELAY_HOST listens on every interface: set "
                "GPUSHARE_RELAY_ADVERTISE_HOST to the address the other replicas reach it at"
            )
        return self

    def _check_s3(self) -> None:
        if not self.s3_bucket:
            raise ValueError("storage=s3 needs a bucket: set GPUSHARE_S3_BUCKET")
        # An upload is published by one server-side copy, which S3 caps at 5 GiB.
        copy_max = 5 * GiB
        fields = ("max_model_bytes", "max_config_bytes", "max_inputs_bytes", "max_output_bytes")
        too_large = [name for name in fields if getattr(self, name) > copy_max]
        if too_large:
            raise ValueError(
                f"with storage=s3 an artifact may be at most 5 GiB ({copy_max} bytes); lower "
                + ", ".join(f"GPUSHARE_{name.upper()}" for name in too_large)
            )

    @property
    def mail_base_url(self) -> str:
        """Where links in mails point: the public URL, else the address this server listens
        on (right for a server on one machine). Never a request's `Host`: whoever sends the
        request would choose where the platform's mail sends its recipient."""
        if self.public_base_url:
            return self.public_base_url
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            host = self.host or "localhost"  # a name
        else:  # every interface: this machine's own name reaches it
            host = "localhost" if ip.is_unspecified else f"[{ip}]" if ip.version == 6 else str(ip)
        return f"http://{host}:{self.port}"

    @property
    def sends_usdc_payouts(self) -> bool:
        """Whether the platform sends USDC payouts on Solana itself: an RPC and a payout
        keypair are configured (whether the keypair loads is the sender's to say)."""
        rpc = self.solana_rpc_url.get_secret_value() if self.solana_rpc_url else ""
        return bool(rpc and (self.solana_payout_keypair_path or self.solana_payout_keypair))

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
