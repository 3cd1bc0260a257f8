"""Hosted uploads (SPEC §1.3)."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field


class ArtifactKind(StrEnum):
    MODEL = "model"
    INPUTS = "inputs"
    CONFIG = "config"
    OUTPUTS = "outputs"  # written by the platform for an invoke's large result
    CHECKPOINT = "checkpoint"  # a training snapshot, so a requeued job resumes


UPLOADABLE_KINDS = (ArtifactKind.MODEL, ArtifactKind.INPUTS, ArtifactKind.CONFIG)

Dimension = int | str | None


class ModelValue(BaseModel):
    """One input or output of an ONNX model, as its graph declares it."""

    name: str
    type: str = Field(
        description="The element type of a tensor (float32, int64, string, …); other values "
        "are written as ONNX does: sequence(map(int64,float32)), optional(float32), …"
    )
    shape: list[Dimension] | None = Field(
        default=None,
        description="Per axis: a size, a symbolic name (batch) or null when the model leaves "
        "it open; null when the rank is not declared or the value is not a tensor",
    )

    def describe(self) -> str:
        """`name: float32[batch,64]`, as the console shows it."""
        if self.shape is None:
            return f"{self.name}: {self.type}"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.type}[{dims}]"


class ModelSignature(BaseModel):
    """What an ONNX model takes and returns, read from its graph when it was uploaded."""

    inputs: list[ModelValue] = Field(description="What an invoke's inputs NPZ must name")
    outputs: list[ModelValue] = Field(description="What the outputs NPZ will hold")
    truncated: bool = Field(
        default=False, description="The model declares more values than are listed here"
    )


class Artifact(BaseModel):
    id: str
    name: str | None = Field(
        default=None,
        description="The uploaded file's name (`?name=` at upload, without any directory); "
        "null when none was given (and for artifacts uploaded before names were kept)",
    )
    url: str
    kind: ArtifactKind
    size: int
    sha256: str
    created_at: datetime
    expires_at: datetime
    signature: ModelSignature | None = Field(
        default=None,
        description="A model's inputs and outputs, read from it at upload; null for other "
        "kinds (and for models uploaded before uploads were checked)",
    )
