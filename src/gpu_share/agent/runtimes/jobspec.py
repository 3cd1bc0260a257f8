"""The contract between the agent and a runtime process, as the agent holds it.

`spec.json` in, `result.json` out. Both files live in the job directory, which is
the runtime's working directory; every path in them is relative to it, so the same
spec works whether the sandbox mounts the directory at `/job` or runs the process in
place.

These are the agent's pydantic models: it validates a spec before writing it and a
verdict after reading it. The runtime process reads and writes the same shapes with
the standard library (`runner`), so that it never imports pydantic or the protocol;
`tests/agent/runtimes/test_imports.py` pins that the two agree.
"""

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_share.agent.runtimes.runner import RESULT_FILENAME, SPEC_FILENAME, job_relative
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName

# The python module the agent runs (`python -m …`) for each runtime.
RUNTIME_MODULES: dict[RuntimeName, str] = {
    RuntimeName.ONNX_CPU: "gpu_share.agent.runtimes.onnx",
    RuntimeName.ONNX_CUDA: "gpu_share.agent.runtimes.onnx",
    RuntimeName.CATBOOST_CPU: "gpu_share.agent.runtimes.catboost",
    RuntimeName.CATBOOST_CUDA: "gpu_share.agent.runtimes.catboost",
}

# The codes a runtime may fail with (`runner.FailureCode`); anything else is the agent's.
RuntimeFailureCode = Literal[
    ErrorCode.INVALID_MODEL,
    ErrorCode.INVALID_INPUTS,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.RUNTIME_ERROR,
    ErrorCode.OUT_OF_MEMORY,
    ErrorCode.RESOURCE_LIMIT,
]


class JobSpec(BaseModel):
    """`spec.json`: what to run, written by the agent."""

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeName
    model: str = Field(description="The model file (ONNX) or train config (CatBoost)")
    inputs: str | None = Field(default=None, description="NPZ of inputs; null: zero-filled")
    outputs_dir: str = "out"
    threads: int | None = Field(default=None, ge=1, le=1024, description="intra-op threads")
    memory_limit_bytes: int | None = Field(
        default=None,
        ge=1,
        description="The job's memory limit; inputs that expand past it "
        "are refused before they are read",
    )
    max_inputs_expanded_bytes: int | None = Field(
        default=None,
        ge=1,
        description="MAX_INPUTS_EXPANDED_BYTES: inputs that expand past it are refused before "
        "they are read, whatever the memory; null: the runtime's default (2 GiB)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="runtime-specific")

    @field_validator("model", "outputs_dir")
    @classmethod
    def _inside_job(cls, value: str) -> str:
        return job_relative(value)

    @field_validator("inputs")
    @classmethod
    def _inputs_inside_job(cls, value: str | None) -> str | None:
        return None if value is None else job_relative(value)

    @property
    def result_path(self) -> Path:
        return Path(self.outputs_dir) / RESULT_FILENAME


class RuntimeFailure(BaseModel):
    code: RuntimeFailureCode
    message: str = Field(description="What went wrong and what to change, for the tenant")


class RuntimeMetrics(BaseModel):
    device: Literal["cpu", "cuda"] = Field(description="What really ran the job")
    execution_provider: str | None = None
    gpu_model: str | None = None
    load_ms: int = Field(description="Reading the model and preparing to run")
    compute_ms: int = Field(description="Running it, without loading")
    peak_rss_bytes: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict, description="runtime-specific")


class RuntimeResult(BaseModel):
    """`<outputs_dir>/result.json`: the verdict, written by the runtime."""

    ok: bool
    outputs: str | None = Field(default=None, description="Path of the outputs file, job-relative")
    outputs_format: str | None = Field(default=None, description="npz, …")
    metrics: RuntimeMetrics | None = None
    error: RuntimeFailure | None = None

    @model_validator(mode="after")
    def _verdict_is_consistent(self) -> Self:
        if self.ok and (self.error is not None or self.outputs is None or self.metrics is None):
            raise ValueError("a successful result has outputs and metrics and no error")
        if not self.ok and self.error is None:
            raise ValueError("a failed result carries an error")
        return self

    @classmethod
    def failure(cls, code: RuntimeFailureCode, message: str) -> Self:
        return cls(ok=False, error=RuntimeFailure(code=code, message=message))


def write_spec(job_dir: Path, spec: JobSpec) -> Path:
    path = job_dir / SPEC_FILENAME
    path.write_text(spec.model_dump_json(indent=2))
    return path


def read_result(path: str | Path) -> RuntimeResult | None:
    """The verdict at `path`; None when there is none or it is not a `RuntimeResult`,
    which means the runtime crashed and its log is the only witness."""
    try:
        return RuntimeResult.model_validate_json(Path(path).read_bytes())
    except (OSError, ValidationError):
        return None
