"""Provider applications (SPEC §3.1, §3.5): what an applicant sends, what an admin decides.

An applicant has no account yet: submitting mails a link to the email given, and the
application counts once that link is opened (`ApplicationSubmitted`). Confirming answers
a private status token (`gpu_st_…`, also mailed) that reads the decision and amends the
application when more information was asked for. Approval makes the provider account and
a one-time claim link where the provider sees their key and enrollment token.
"""

from datetime import datetime
from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, Field, model_validator

from gpu_share.protocol.common import Email
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.schedules import Availability


class GpuModelInfo(BaseModel):
    """A supported GPU model and its datasheet figures (dense, no sparsity)."""

    id: str = Field(description="What an application names, e.g. h100-80gb")
    name: str
    vram_gb: int
    fp32_tflops: float
    fp16_tflops: float = Field(description="FP16 on tensor cores, dense")
    tf32_tflops: float = Field(description="TF32 on tensor cores, dense")
    bf16_tflops: float = Field(description="BF16 on tensor cores, dense")
    memory_bandwidth_gbs: float = Field(description="Device memory bandwidth, GB/s")


OTHER_MODEL = "other"


class GpuEntry(BaseModel):
    """One GPU model (or group of identical GPUs) offered, on one kind of machine."""

    model: str = Field(
        min_length=1,
        max_length=40,
        description="An id from GET /v1/provider/gpu-models, or 'other' with other_model",
    )
    other_model: str | None = Field(
        default=None, min_length=1, max_length=120, description="The model, when 'other'"
    )
    count: int = Field(ge=1, le=1024, description="How many GPUs of this model")
    system_ram_gb: int = Field(ge=1, le=65_536, description="RAM of the host machine")
    internet_up_gbps: float = Field(gt=0, le=400, allow_inf_nan=False)
    internet_down_gbps: float = Field(gt=0, le=400, allow_inf_nan=False)
    availability: Availability = Field(default_factory=Availability)
    location: str = Field(min_length=2, max_length=200, description="City, country or region")

    @model_validator(mode="after")
    def _other_named(self) -> Self:
        if self.model == OTHER_MODEL and not self.other_model:
            raise ValueError("other_model: name the GPU model when model is 'other'")
        if self.model != OTHER_MODEL and self.other_model:
            raise ValueError("other_model: only for model 'other'")
        return self


class ApplicationStatus(StrEnum):
    PENDING = "pending"
    INFO_REQUESTED = "info_requested"
    APPROVED = "approved"
    REJECTED = "rejected"

    @property
    def open(self) -> bool:
        return self in (ApplicationStatus.PENDING, ApplicationStatus.INFO_REQUESTED)


class ProviderApplicationCreate(BaseModel):
    model_config = {"extra": "forbid"}

    full_name: str = Field(min_length=2, max_length=200)
    email: Email
    company: str | None = Field(default=None, max_length=200)
    gpus: list[GpuEntry] = Field(min_length=1, max_length=32)
    ups: bool = Field(description="Protected by an uninterruptible power supply")
    commitment_months: Literal[3, 6, 12, 24] = Field(
        description="How long the hardware stays available"
    )
    maintenance_notes: str | None = Field(default=None, max_length=4000)


class ProviderApplication(BaseModel):
    id: str
    status: ApplicationStatus
    full_name: str
    email: str
    company: str | None
    gpus: list[GpuEntry]
    ups: bool
    commitment_months: int
    maintenance_notes: str | None
    tier: Tier | None = Field(description="Set on approval")
    message: str | None = Field(
        description="The admin's words: why it was rejected, or what more is needed"
    )
    provider_id: str | None
    created_at: datetime
    updated_at: datetime
    decided_at: datetime | None


class ApplicationReceipt(ProviderApplication):
    """What confirming the email answers: the application, and how to follow it."""

    status_token: str = Field(
        description="gpu_st_…: reads and amends this application; shown once, keep it"
    )
    status_url: str = Field(description="The private page where the decision appears")


class Approval(BaseModel):
    tier: Tier


class InfoRequest(BaseModel):
    message: str = Field(min_length=3, max_length=4000, description="What the applicant should add")


class Approved(BaseModel):
    application: ProviderApplication
    provider_id: str
    claim_url: str = Field(
        description="One-time link where the provider sees their key and enrollment token; "
        "also mailed to them"
    )


class ProviderClaim(BaseModel):
    provider_id: str
    api_key: str = Field(description="gpu_pk_…: shown this once")
    enrollment_token: str = Field(description="gpu_et_…: for `gpu-share agent --token`")
    install_command: str
