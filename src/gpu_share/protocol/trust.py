"""Hardware challenges on the wire (docs/trust.md, "Hardware challenges").

    heartbeat answer `challenge`           a challenge waits for the node (ChallengeOrder)
    POST /v1/agent/challenges/{id}/start   → ChallengeStart: the seed; the clock starts
    POST /v1/agent/challenges/{id}/commit  ChallengeCommit → ChallengeCommitted: the samples
    POST /v1/agent/challenges/{id}/reveal  ChallengeReveal → ChallengeVerdict
    GET  /v1/provider/nodes/{id}/challenges, GET /v1/admin/nodes/{id}/challenges → [Challenge]

Sketches travel as base64 of little-endian int32 (step-major: all chunks of step 1,
then of step 2, …), revealed rows as base64 of two bits an entry. Both are bounded
here and by the request limit of their routes (`MAX_ANSWER_BODY_BYTES`).
"""

import base64
import binascii
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, Field, model_validator

MAX_WIDTH = 2048
MAX_ROWS = 1 << 26
MAX_STEPS = 1024
MAX_SKETCH_ROWS = 4096
MAX_SAMPLES = 8
MAX_SKETCHES = 1 << 21
MAX_REVEAL_BYTES = 12 << 20  # packed rows in one reveal
MAX_ANSWER_BODY_BYTES = 24 << 20  # a commit or a reveal, base64 and JSON included


def _b64_chars(raw: int) -> int:
    return (raw + 2) // 3 * 4


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("is not base64") from exc
    return value


def decode(value: str) -> bytes:
    """A field this module checked as base64."""
    return base64.b64decode(value, validate=True)


class ChallengeKind(StrEnum):
    GPU = "gpu"  # one GPU, in FP16, against its model's datasheet
    CPU = "cpu"  # a CPU node's claimed cores, in FP32, against the CPU baseline


class ChallengeStatus(StrEnum):
    ISSUED = "issued"  # waiting for the node to start it
    STARTED = "started"  # the node has the seed; the commit deadline runs
    COMMITTED = "committed"  # the sketches arrived in time; the reveal deadline runs
    PASSED = "passed"
    FAILED = "failed"  # late, wrong, or malformed
    EXPIRED = "expired"  # the node did not answer in time

    @property
    def final(self) -> bool:
        return self in (ChallengeStatus.PASSED, ChallengeStatus.FAILED, ChallengeStatus.EXPIRED)


class ChallengeParams(BaseModel):
    """The chain's sizes (`gpu_share.challenge.sizing.Shape`) and the rules of the answer."""

    kind: ChallengeKind
    width: int = Field(ge=16, le=MAX_WIDTH, description="n: entries per row")
    rows: int = Field(ge=16, le=MAX_ROWS, description="h: rows of the state")
    steps: int = Field(ge=1, le=MAX_STEPS, description="K: products in the chain")
    sketch_rows: int = Field(ge=8, le=MAX_SKETCH_ROWS, description="C: rows per sketch")
    samples: int = Field(ge=1, le=MAX_SAMPLES, description="Chunks asked for at the reveal")
    deadline_sec: float = Field(
        gt=0, description="For the commit after the start, and for the reveal after the commit"
    )
    target_sec: float = Field(gt=0, description="What the chain takes at the claimed rate")


class ChallengeOrder(BaseModel):
    """A challenge waits: start it when no job or session holds the hardware."""

    id: str
    kind: ChallengeKind
    target: str = Field(description='The GPU\'s UUID, or "cpu"')
    gpu_index: int | None = Field(default=None, description="The GPU's NVML index")
    claimed_model: str = Field(description="What the hardware is challenged as")
    params: ChallengeParams = Field(
        description="The chain's sizes: the node readies it before it asks for the seed"
    )


class ChallengeStart(BaseModel):
    id: str
    seed: str = Field(description="32 hex characters; every matrix follows from it")
    params: ChallengeParams
    started_at: datetime
    commit_by: datetime


Base64Sketches = Annotated[
    str, Field(max_length=_b64_chars(4 * MAX_SKETCHES)), AfterValidator(_base64)
]
Base64Chunk = Annotated[
    str, Field(max_length=_b64_chars(MAX_SKETCH_ROWS * MAX_WIDTH // 4)), AfterValidator(_base64)
]


class ChallengeCommit(BaseModel):
    sketches: Base64Sketches = Field(
        description="Every step's sketches, int32 little-endian, step-major"
    )


class ChallengeSample(BaseModel):
    step: int = Field(ge=0, lt=MAX_STEPS, description="t: reveal X_t and X_{t+1}")
    chunk: int = Field(ge=0, description="c: the chunk of rows")


class ChallengeVerdict(BaseModel):
    id: str
    status: ChallengeStatus
    reason: str | None = Field(default=None, description="Why it failed or expired")
    rate: float | None = Field(
        default=None,
        description="The rate the node showed: the chain's FLOPs over the time "
        "from its start to its commit",
    )
    rate_unit: str | None = Field(default=None, description="TFLOP/s (a GPU) or GFLOP/s (a CPU)")
    finished_at: datetime | None = None


class ChallengeCommitted(BaseModel):
    samples: list[ChallengeSample] = Field(
        default_factory=list, description="Reveal these, in this order"
    )
    reveal_by: datetime | None = None
    verdict: ChallengeVerdict | None = Field(
        default=None, description="Set when the commit ended the challenge (it came too late)"
    )


class RevealedSample(BaseModel):
    step: int = Field(ge=0, lt=MAX_STEPS)
    chunk: int = Field(ge=0)
    before: Base64Chunk = Field(description="X_t's chunk, packed")
    source: Base64Chunk = Field(description="The chunk whose rows X_t's chunk is paired with")
    after: Base64Chunk = Field(description="X_{t+1}'s chunk, packed")


class ChallengeReveal(BaseModel):
    samples: list[RevealedSample] = Field(max_length=MAX_SAMPLES)

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        total = sum(len(s.before) + len(s.source) + len(s.after) for s in self.samples)
        if total > _b64_chars(MAX_REVEAL_BYTES):
            raise ValueError(f"a reveal carries at most {MAX_REVEAL_BYTES} bytes of rows")
        return self


class Challenge(BaseModel):
    """A challenge as providers and admins read it."""

    id: str
    node_id: str
    kind: ChallengeKind
    target: str
    claimed_model: str
    status: ChallengeStatus
    issued_at: datetime
    started_at: datetime | None
    committed_at: datetime | None
    finished_at: datetime | None
    params: ChallengeParams
    verdict: ChallengeVerdict | None
