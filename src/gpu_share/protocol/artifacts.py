"""Hosted uploads (SPEC §1.3)."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel


class ArtifactKind(StrEnum):
    MODEL = "model"
    INPUTS = "inputs"
    CONFIG = "config"
    OUTPUTS = "outputs"  # written by the platform for an invoke's large result
    CHECKPOINT = "checkpoint"  # a training snapshot, so a requeued job resumes


UPLOADABLE_KINDS = (ArtifactKind.MODEL, ArtifactKind.INPUTS, ArtifactKind.CONFIG)


class Artifact(BaseModel):
    id: str
    url: str
    kind: ArtifactKind
    size: int
    sha256: str
    created_at: datetime
    expires_at: datetime
