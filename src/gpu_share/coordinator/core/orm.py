"""Tables, as SQLAlchemy 2 `Mapped[]` classes; the same on SQLite and PostgreSQL.

Every timestamp is UTC. Migrations in `migrations/versions` must produce exactly
this metadata (a test compares them).
"""

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in Python; naive UTC in SQLite, timestamptz in PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime,
        dict[str, Any]: JSON,
        list[Any]: JSON,
    }


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(254))
    created_at: Mapped[datetime]
    last_served_at: Mapped[datetime | None]  # fair share: whose turn a free slot is


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(24))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), index=True)
    provider_id: Mapped[str | None] = mapped_column(ForeignKey("providers.id"), index=True)
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class TenantApplicationRow(Base):
    __tablename__ = "tenant_applications"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(254))
    company: Mapped[str | None] = mapped_column(String(200))
    intended_use: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"))
    created_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    # Counts (is reviewed, blocks another with its email) only once its email is confirmed.
    email_confirmed_at: Mapped[datetime | None]


class BlobRow(Base):
    """One stored object per distinct content; artifacts of any tenant point at it."""

    __tablename__ = "blobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]


class ArtifactRow(Base):
    __tablename__ = "artifacts"
    __table_args__ = (Index(None, "tenant_id", "expires_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    kind: Mapped[str] = mapped_column(String(16))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    blob_id: Mapped[str | None] = mapped_column(ForeignKey("blobs.id"), index=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)
    # A model's inputs and outputs (`ModelSignature`), read at upload; None for other kinds.
    signature: Mapped[dict[str, Any] | None]
    # The uploaded file's name (`protocol.names.file_name`); None: uploaded without one.
    name: Mapped[str | None] = mapped_column(String(200))


class ServerSecretRow(Base):
    """Secrets every replica must share (e.g. the key that signs artifact URLs for agents)."""

    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]


class ProviderRow(Base):
    __tablename__ = "providers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(254))
    tier: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    # An approved applicant's one-time link to their key and enrollment token.
    claim_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    claim_expires_at: Mapped[datetime | None]
    claimed_at: Mapped[datetime | None]
    reliability: Mapped[dict[str, Any] | None]  # over all its nodes, as last computed
    # Payouts (SPEC §3.6): protocol.payouts.PayoutMethod as stored, and the schedule.
    payout_method: Mapped[dict[str, Any] | None]
    payout_schedule: Mapped[str] = mapped_column(
        String(16), default="weekly", server_default=text("'weekly'")
    )
    # Trust (docs/trust.md): caught cheating how often, and suspended for it.
    offences: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    suspended_at: Mapped[datetime | None]


class EnrollmentTokenRow(Base):
    """Lets an agent register nodes for a provider; reusable across machines until it
    expires or is revoked (rotating revokes it and issues another)."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(24))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]  # None: made before tokens expired; see migration 0011


class NodeRow(Base):
    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), index=True)
    hostname: Mapped[str] = mapped_column(String(255))
    # What the provider calls the machine (`protocol.names.NodeLabel`); None: not named.
    label: Mapped[str | None] = mapped_column(String(64))
    agent_version: Mapped[str] = mapped_column(String(50))
    os: Mapped[str | None] = mapped_column(String(200))
    cpu_model: Mapped[str | None] = mapped_column(String(200))
    cpu_count: Mapped[int] = mapped_column(Integer)
    ram_mb: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[list[Any]]
    runtimes: Mapped[list[Any]]
    sandbox: Mapped[str] = mapped_column(String(20))
    max_concurrent_jobs: Mapped[int] = mapped_column(Integer)
    # What each job may use (NodeInventory.job_memory_mb); None: an agent that did not say.
    job_memory_mb: Mapped[int | None] = mapped_column(BigInteger)
    region: Mapped[str | None] = mapped_column(String(64))
    tier: Mapped[str] = mapped_column(String(16))
    price_per_gpu_hour_micro: Mapped[int | None] = mapped_column(BigInteger)
    telemetry: Mapped[dict[str, Any] | None]
    delisted: Mapped[bool] = mapped_column(Boolean, default=False)
    registered_at: Mapped[datetime]
    last_seen_at: Mapped[datetime | None] = mapped_column(index=True)
    # The provider's weekly windows (protocol.schedules.Availability); None: 24/7.
    availability: Mapped[dict[str, Any] | None]
    # Benchmarks: the latest verdict per GPU (and for the node), and when one is due.
    benchmark_state: Mapped[dict[str, Any] | None]
    benchmark_requested_at: Mapped[datetime | None]
    last_benchmark_at: Mapped[datetime | None]
    # The published reliability score and its components, as last computed.
    reliability: Mapped[dict[str, Any] | None]
    # Placement: a node waiting in a lease long-poll, and what it can take.
    polling_until: Mapped[datetime | None] = mapped_column(index=True)
    poll_free_slots: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    poll_free_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # NVLink/PCIe links between its GPUs, from NVML (protocol.agent.GpuTopology as stored).
    gpu_topology: Mapped[dict[str, Any] | None]
    # The enrollment token it registered with (how many machines a token enrolled).
    enrollment_token_id: Mapped[str | None] = mapped_column(
        ForeignKey("enrollment_tokens.id"), index=True
    )
    # Trust (docs/trust.md). The machine's fingerprint: the same hardware registering again
    # is this node again, whatever token or agent it comes with.
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    # What its challenges proved, per GPU UUID (and "cpu"): model, when, until when.
    verification: Mapped[dict[str, Any] | None]
    next_challenge_at: Mapped[datetime | None] = mapped_column(index=True)
    # Results spot-checked on trusted nodes: the adaptive rate's counters.
    spot_checks: Mapped[dict[str, Any] | None]
    trusted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    quarantined_at: Mapped[datetime | None]
    quarantine_reason: Mapped[str | None] = mapped_column(Text)


class InvokeRow(Base):
    __tablename__ = "invokes"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key"),
        Index(None, "status", "created_at"),
        Index(None, "tenant_id", "id"),
        Index(None, "node_id", "status"),
        Index(None, "tenant_id", "status", "priority", "created_at"),  # fair-share claims
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    status: Mapped[str] = mapped_column(String(16))
    runtime: Mapped[str] = mapped_column(String(32))
    priority: Mapped[str] = mapped_column(String(16))
    model_url: Mapped[str] = mapped_column(Text)
    inputs_url: Mapped[str] = mapped_column(Text)
    model_artifact_id: Mapped[str | None] = mapped_column(String(40))
    inputs_artifact_id: Mapped[str | None] = mapped_column(String(40))
    model_sha256: Mapped[str | None] = mapped_column(String(64))
    inputs_sha256: Mapped[str | None] = mapped_column(String(64))
    timeout_sec: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    constraints: Mapped[dict[str, Any]]
    outputs_upload: Mapped[dict[str, Any] | None]
    warnings: Mapped[list[Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)

    created_at: Mapped[datetime]
    assigned_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    deadline_at: Mapped[datetime | None] = mapped_column(index=True)
    finished_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]

    result: Mapped[dict[str, Any] | None]
    checkpoint_artifact_id: Mapped[str | None] = mapped_column(String(40))
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    error_code: Mapped[str | None] = mapped_column(String(40))
    error_message: Mapped[str | None] = mapped_column(Text)
    webhook_url: Mapped[str | None] = mapped_column(Text)  # told when it ends (webhooks)

    # Billing (micro-USDC): the tenant's cap, what is held for the most it can cost, the
    # rate fixed at placement (per hour, all its GPUs), and what it cost once settled.
    max_cost_micro: Mapped[int | None] = mapped_column(BigInteger)
    reserved_micro: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    rate_micro_per_hour: Mapped[int | None] = mapped_column(BigInteger)
    cost_micro: Mapped[int | None] = mapped_column(BigInteger)

    # Rental modes (SPEC §4.3): spot work preempted so far, a preemption asked of its node,
    # and the dedicated reservation it runs in; the GPU indices its node gave it.
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    preempt_requested_at: Mapped[datetime | None]
    reservation_id: Mapped[str | None] = mapped_column(String(40), index=True)
    gpu_indices: Mapped[list[Any] | None]

    # Trust (docs/trust.md): a check re-runs the invoke `check_of` on a trusted node; the
    # invoke checked says how its check came out, and why it was refunded if it was.
    check_of: Mapped[str | None] = mapped_column(String(40), index=True)
    check_state: Mapped[str | None] = mapped_column(String(16), index=True)
    refunded_at: Mapped[datetime | None]
    refund_reason: Mapped[str | None] = mapped_column(Text)


class InvokeLogRow(Base):
    """The job's log in pieces, in the order the agent sent them."""

    __tablename__ = "invoke_logs"
    __table_args__ = (Index(None, "invoke_id", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    invoke_id: Mapped[str] = mapped_column(ForeignKey("invokes.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    text: Mapped[str] = mapped_column(Text)


class ReplicaRow(Base):
    """A running coordinator process, and the address its peers relay session traffic to
    (`relay_url`; None: it takes none). Beaten by the process; a stale row is a dead one."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    relay_url: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime]
    seen_at: Mapped[datetime]


class NodeChannelRow(Base):
    """The replica that holds a node's session channel (its WebSocket) now."""

    __tablename__ = "node_channels"

    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), primary_key=True)
    replica_id: Mapped[str] = mapped_column(String(40), index=True)
    connected_at: Mapped[datetime]


class SessionRow(Base):
    """A model held loaded on a node (SPEC §1.7); live state is in the holding replica."""

    __tablename__ = "gpu_sessions"
    __table_args__ = (Index(None, "tenant_id", "id"), Index(None, "status", "touched_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    node_id: Mapped[str | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    runtime: Mapped[str] = mapped_column(String(32))
    model_url: Mapped[str] = mapped_column(Text)
    model_artifact_id: Mapped[str | None] = mapped_column(String(40))
    model_sha256: Mapped[str | None] = mapped_column(String(64))
    idle_timeout_sec: Mapped[int] = mapped_column(Integer)
    max_batch: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int] = mapped_column(Integer)
    reserved_mb: Mapped[int] = mapped_column(Integer)
    device: Mapped[str | None] = mapped_column(String(16))
    inputs: Mapped[list[Any] | None]
    created_at: Mapped[datetime]
    ready_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    touched_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    forward_count: Mapped[int] = mapped_column(BigInteger, default=0)
    error_code: Mapped[str | None] = mapped_column(String(40))
    error_message: Mapped[str | None] = mapped_column(Text)
    webhook_url: Mapped[str | None] = mapped_column(Text)  # told when it opens and closes

    # Billing (micro-USDC), as on invokes; a session is charged for the time it is held,
    # up to `billed_until` so far.
    reserved_micro: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    rate_micro_per_hour: Mapped[int | None] = mapped_column(BigInteger)
    cost_micro: Mapped[int | None] = mapped_column(BigInteger)
    billed_until: Mapped[datetime | None]
    reservation_id: Mapped[str | None] = mapped_column(String(40), index=True)
    # Whole GPUs the session holds (0: it shares the node's first GPU by memory, as
    # before), and which; the model runs on the first of them.
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    gpu_indices: Mapped[list[Any] | None]


class BrowserSessionRow(Base):
    """A signed-in browser: its cookie names this row, so signing out (or revoking the key
    it signed in with) ends it on every replica."""

    __tablename__ = "browser_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # a hash of the cookie's id
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]


class RateLimitRow(Base):
    """Hits per client and limit in one fixed window; shared by every replica."""

    __tablename__ = "rate_limits"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)  # limit name and client
    window_start: Mapped[datetime] = mapped_column(primary_key=True, index=True)
    hits: Mapped[int] = mapped_column(Integer)


OPEN_APPLICATION = "status IN ('pending', 'info_requested') AND email_confirmed_at IS NOT NULL"


class ProviderApplicationRow(Base):
    """A would-be provider's application (SPEC §3.1); its status link is sealed, not stored."""

    __tablename__ = "provider_applications"
    __table_args__ = (
        # one open application per email, whichever replica takes the second
        Index(
            "uq_provider_applications_open_email",
            "email",
            unique=True,
            postgresql_where=text(OPEN_APPLICATION),
            sqlite_where=text(OPEN_APPLICATION),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    full_name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(254))
    company: Mapped[str | None] = mapped_column(String(200))
    gpus: Mapped[list[Any]]
    ups: Mapped[bool] = mapped_column(Boolean)
    commitment_months: Mapped[int] = mapped_column(Integer)
    maintenance_notes: Mapped[str | None] = mapped_column(Text)
    tier: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)
    provider_id: Mapped[str | None] = mapped_column(ForeignKey("providers.id"))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    # Counts (is reviewed, blocks another with its email) only once its email is confirmed.
    email_confirmed_at: Mapped[datetime | None]


class OutboxMailRow(Base):
    """A mail to send, written in the transaction of what caused it; sent by a loop."""

    __tablename__ = "outbox_mails"
    __table_args__ = (Index(None, "sent_at", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cause: Mapped[str] = mapped_column(String(120), unique=True)  # never the same mail twice
    to_address: Mapped[str] = mapped_column(String(254))
    subject: Mapped[str] = mapped_column(String(300))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    claimed_until: Mapped[datetime | None]
    claim_token: Mapped[str | None] = mapped_column(String(32))
    sent_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    failed_at: Mapped[datetime | None]  # given up: it could not be built or sent (last_error)


class TelemetrySampleRow(Base):
    """A node's telemetry as one heartbeat reported it; kept for an hour, for live charts."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (Index(None, "node_id", "at"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(index=True)
    telemetry: Mapped[dict[str, Any]]


class BenchmarkRunRow(Base):
    """One run of a node's benchmark suite: what it measured and the verdict per GPU."""

    __tablename__ = "benchmark_runs"
    __table_args__ = (Index(None, "node_id", "finished_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    trigger: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    report: Mapped[dict[str, Any]]  # the measurements, as the agent sent them
    scores: Mapped[dict[str, Any]]  # the verdict: per GPU and for the node
    passed: Mapped[bool] = mapped_column(Boolean)


class NodePresenceRow(Base):
    """Heartbeats a node sent in one 5-minute bucket: uptime, for the reliability score."""

    __tablename__ = "node_presence"

    node_id: Mapped[str] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    bucket_start: Mapped[datetime] = mapped_column(primary_key=True)
    beats: Mapped[int] = mapped_column(Integer)


class ProviderPriceRow(Base):
    """A provider's rate for one GPU model (SPEC §3.4); applies to work placed after it."""

    __tablename__ = "provider_prices"

    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(200), primary_key=True)  # or "cpu"
    price_micro_per_hour: Mapped[int] = mapped_column(BigInteger)  # per GPU
    spot_discount_bps: Mapped[int] = mapped_column(Integer)  # 3000..7000
    updated_at: Mapped[datetime]


class LedgerAccountRow(Base):
    """The kept balance of an account that holds someone's money (never below zero)."""

    __tablename__ = "ledger_accounts"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)  # kind:owner
    kind: Mapped[str] = mapped_column(String(32))
    owner_id: Mapped[str | None] = mapped_column(String(40), index=True)
    balance_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime]


class LedgerTransactionRow(Base):
    """A balanced set of entries, posted once for its cause (the unique key)."""

    __tablename__ = "ledger_transactions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    cause: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(index=True)
    details: Mapped[dict[str, Any]]  # what it was for: invoke, node, GPU model, seconds…


class LedgerEntryRow(Base):
    __tablename__ = "ledger_entries"
    __table_args__ = (Index(None, "account_id", "created_at"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    transaction_id: Mapped[str] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    # Not a foreign key: shared accounts (world, commission) have no row (services/money/ledger.py).
    account_id: Mapped[str] = mapped_column(String(120))
    amount_micro: Mapped[int] = mapped_column(BigInteger)  # the books sum to zero
    created_at: Mapped[datetime]


class EarningsHoldRow(Base):
    """A charge's provider share still in the provider's held account: payable once its
    hold has passed, refundable until then (services/money/earnings_hold.py). Deleted
    when released or refunded; a forfeit lowers `amount_micro` and keeps the row, so the
    charge can still be refunded within the hold."""

    __tablename__ = "earnings_holds"
    __table_args__ = (Index(None, "hold", "earned_at"), Index(None, "provider_id", "earned_at"))

    charge_id: Mapped[str] = mapped_column(ForeignKey("ledger_transactions.id"), primary_key=True)
    # Not foreign keys, as in the charge's details: the books outlive what they name.
    provider_id: Mapped[str] = mapped_column(String(40))
    node_id: Mapped[str] = mapped_column(String(40), index=True)
    hold: Mapped[str] = mapped_column(String(24))  # earnings_hold.Hold: which length applies
    earned_at: Mapped[datetime]  # the charge's posting time; the hold counts from it
    amount_micro: Mapped[int] = mapped_column(BigInteger)  # still held


class PayoutBatchRow(Base):
    """The payouts one scheduled run made, exported together for execution."""

    __tablename__ = "payout_batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    period: Mapped[str] = mapped_column(String(40), unique=True)  # once per period
    created_at: Mapped[datetime]
    exported_at: Mapped[datetime | None]


class PayoutRow(Base):
    """Money on its way to a provider: in_transit → paid (with its reference) or failed."""

    __tablename__ = "payouts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"), index=True)
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("payout_batches.id"), index=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    method: Mapped[dict[str, Any]]  # the provider's method when the payout was made
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime]
    settled_at: Mapped[datetime | None]
    reference: Mapped[str | None] = mapped_column(String(200))
    failure_reason: Mapped[str | None] = mapped_column(Text)


class ReservationRow(Base):
    """Whole GPUs of one node held for one tenant for a period (SPEC §4.3, dedicated)."""

    __tablename__ = "reservations"
    __table_args__ = (
        Index(None, "node_id", "starts_at", "ends_at"),
        Index(None, "tenant_id", "id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"))
    gpus: Mapped[int] = mapped_column(Integer)  # how many of the node's GPUs
    gpu_indices: Mapped[list[Any]]  # which ones
    status: Mapped[str] = mapped_column(String(16), index=True)  # pending, active, ended, canceled
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    rate_micro_per_hour: Mapped[int] = mapped_column(BigInteger)  # all its GPUs together
    cost_micro: Mapped[int] = mapped_column(BigInteger)  # the period, as quoted and charged
    created_at: Mapped[datetime]
    canceled_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    webhook_url: Mapped[str | None] = mapped_column(Text)  # told as it starts and ends


class ChallengeRow(Base):
    """A timed, seeded proof that a node's GPU (or its CPU) is what it claims (docs/trust.md).

    issued → started (the node has the seed) → committed (its answer, in time) → passed or
    failed once the samples it was asked for are checked; expired when it never answered."""

    __tablename__ = "challenges"
    __table_args__ = (Index(None, "node_id", "issued_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(80))  # a GPU's UUID, or "cpu"
    claimed_model: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict[str, Any]]  # sizes and deadlines, sized to the claimed model
    seed: Mapped[str] = mapped_column(String(64))  # given to the node only when it starts
    status: Mapped[str] = mapped_column(String(16), index=True)
    issued_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    committed_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    commitment: Mapped[dict[str, Any] | None]
    samples: Mapped[dict[str, Any] | None]  # what the coordinator asked to see
    verdict: Mapped[dict[str, Any] | None]  # why it passed or failed, the rate it showed


class TrustIncidentRow(Base):
    """A node caught: what it did, the evidence, and what it cost whom (docs/trust.md)."""

    __tablename__ = "trust_incidents"
    __table_args__ = (Index(None, "provider_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"))
    kind: Mapped[str] = mapped_column(String(32))
    invoke_id: Mapped[str | None] = mapped_column(String(40))
    check_invoke_id: Mapped[str | None] = mapped_column(String(40))
    challenge_id: Mapped[str | None] = mapped_column(String(40))
    evidence: Mapped[dict[str, Any]]
    refunded_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    forfeited_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime]


class SpendingLimitRow(Base):
    """A tenant's own limits (services/money/spending_limits.py): a monthly cap on new
    work and a low-balance threshold to be mailed at. No row: no limits (deleted when
    both are removed, so the reserve path finds nothing to do for most tenants)."""

    __tablename__ = "spending_limits"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    monthly_cap_micro: Mapped[int | None] = mapped_column(BigInteger)
    low_balance_micro: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]


class WebhookSecretRow(Base):
    """An account's webhook signing key (Standard Webhooks `whsec_…`). It is an HMAC key
    the coordinator signs with, so it is kept as is (never logged, shown once); after a
    rotation the previous key signs too until `previous_until`."""

    __tablename__ = "webhook_secrets"

    owner_id: Mapped[str] = mapped_column(String(40), primary_key=True)  # tenant or provider
    secret: Mapped[str] = mapped_column(String(80))
    previous_secret: Mapped[str | None] = mapped_column(String(80))
    previous_until: Mapped[datetime | None]
    created_at: Mapped[datetime]
    rotated_at: Mapped[datetime | None]


class WebhookEndpointRow(Base):
    """A URL of an account's that receives the account's events of the types it names."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index(None, "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(40))
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[Any]]
    created_at: Mapped[datetime]


class WebhookDeliveryRow(Base):
    """One event for one URL (a Standard Webhooks message: `id` is its `webhook-id`),
    written in the transaction of the change that causes it; sent by a loop."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("cause", "target"),  # never the same event twice to one target
        Index(None, "owner_id", "id"),
        Index(None, "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(40))
    cause: Mapped[str] = mapped_column(String(120))
    target: Mapped[str] = mapped_column(String(40))  # an endpoint's id, or "url" (per object)
    url: Mapped[str] = mapped_column(Text)
    event_type: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)  # the JSON sent and signed, byte for byte
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime]
    retry_from: Mapped[datetime]  # retried for the settings' window from here (emit, replay)
    claimed_until: Mapped[datetime | None]
    claim_token: Mapped[str | None] = mapped_column(String(32))
    delivered_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)


class WebhookAttemptRow(Base):
    """One try at a delivery, as the delivery log shows it."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index(None, "delivery_id", "at"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE")
    )
    at: Mapped[datetime]
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[int] = mapped_column(Integer)


class SepaExportRow(Base):
    """A batch's bank payouts as the one pain.001 file made for them, kept as served so
    that exporting again gives the same file, with the rate it was made at."""

    __tablename__ = "sepa_exports"

    batch_id: Mapped[str] = mapped_column(ForeignKey("payout_batches.id"), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(35), unique=True)
    eur_per_usdc: Mapped[str] = mapped_column(String(24))  # decimal text, as the admin gave it
    execution_date: Mapped[str] = mapped_column(String(10))  # ISO day asked of the bank
    total_cents: Mapped[int] = mapped_column(BigInteger)
    document: Mapped[str] = mapped_column(Text)  # the pain.001 XML
    created_at: Mapped[datetime]


class BankTransferRow(Base):
    """One payout in a bank file: what was asked of the bank, and under which id its
    statement reports it."""

    __tablename__ = "bank_transfers"

    payout_id: Mapped[str] = mapped_column(ForeignKey("payouts.id"), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("sepa_exports.batch_id"), index=True)
    end_to_end_id: Mapped[str] = mapped_column(String(35), unique=True)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    remainder_micro: Mapped[int] = mapped_column(BigInteger)  # returned to pending


class ChainPayoutRow(Base):
    """A USDC payout the platform sends on Solana: awaiting_approval → sending → finalized
    or failed. The signed transaction is recorded (committed) before it is ever sent."""

    __tablename__ = "chain_payouts"

    payout_id: Mapped[str] = mapped_column(ForeignKey("payouts.id"), primary_key=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    destination: Mapped[str] = mapped_column(String(64))  # the provider's wallet (owner)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(index=True)
    approved_at: Mapped[datetime | None]
    claimed_until: Mapped[datetime | None]  # a replica is sending it until then
    transaction: Mapped[str | None] = mapped_column(Text)  # base64 of the signed transaction
    signature: Mapped[str | None] = mapped_column(String(100), unique=True)
    last_valid_block_height: Mapped[int | None] = mapped_column(BigInteger)
    builds: Mapped[int] = mapped_column(Integer, default=0)  # transactions signed for it
    rejected: Mapped[str | None] = mapped_column(Text)  # why the RPC refused the last send
    settled_at: Mapped[datetime | None]


class DepositRow(Base):
    """A tenant's request to top up with USDC: the reference key its transfer names."""

    __tablename__ = "deposits"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    reference: Mapped[str] = mapped_column(String(64), unique=True)  # a fresh public key
    amount_hint_micro: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)


class DepositArrivalRow(Base):
    """A finalized transfer credited to a deposit's tenant, once (its signature is the key)."""

    __tablename__ = "deposit_arrivals"

    signature: Mapped[str] = mapped_column(String(100), primary_key=True)
    deposit_id: Mapped[str] = mapped_column(ForeignKey("deposits.id"), index=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    arrived_at: Mapped[datetime]
