"""The contract between the agent and a runtime process: `spec.json` in, `result.json` out.

Both files live in the job directory, which is the runtime's working directory;
every path in them is relative to it, so the same spec works whether the sandbox
mounts the directory at `/job` or runs the process in place.

A runtime module is a `run(spec) -> RuntimeResult` function handed to
`run_runtime`, which owns the parts every runtime shares: reading the spec,
turning a `JobFailure` into a failed result, writing `result.json` atomically and
exiting 0 for every verdict the tenant can act on.
"""

import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_share.agent import failures
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName

SPEC_FILENAME = "spec.json"
RESULT_FILENAME = "result.json"

# The python module the agent runs (`python -m …`) for each runtime.
RUNTIME_MODULES: dict[RuntimeName, str] = {
    RuntimeName.ONNX_CPU: "gpu_share.agent.runtimes.onnx",
    RuntimeName.ONNX_CUDA: "gpu_share.agent.runtimes.onnx",
    RuntimeName.CATBOOST_CPU: "gpu_share.agent.runtimes.catboost",
    RuntimeName.CATBOOST_CUDA: "gpu_share.agent.runtimes.catboost",
}

# The codes a runtime may fail with; anything else is the agent's to decide.
RuntimeFailureCode = Literal[
    ErrorCode.INVALID_MODEL,
    ErrorCode.INVALID_INPUTS,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.RUNTIME_ERROR,
    ErrorCode.OUT_OF_MEMORY,
    ErrorCode.RESOURCE_LIMIT,
]


def _job_relative(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be a path inside the job directory, such as in/model")
    return value


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
    options: dict[str, Any] = Field(default_factory=dict, description="runtime-specific")

    @field_validator("model", "outputs_dir")
    @classmethod
    def _inside_job(cls, value: str) -> str:
        return _job_relative(value)

    @field_validator("inputs")
    @classmethod
    def _inputs_inside_job(cls, value: str | None) -> str | None:
        return None if value is None else _job_relative(value)

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


class JobFailure(Exception):
    """A verdict the tenant can act on; `run_runtime` writes it as a failed result."""

    def __init__(self, code: RuntimeFailureCode, message: str) -> None:
        super().__init__(message)
        self.code: RuntimeFailureCode = code
        self.message = message


def write_spec(job_dir: Path, spec: JobSpec) -> Path:
    path = job_dir / SPEC_FILENAME
    path.write_text(spec.model_dump_json(indent=2))
    return path


def read_spec(path: Path) -> JobSpec:
    """Raises `JobFailure(INVALID_CONFIG)`: a spec the runtime cannot follow."""
    try:
        return JobSpec.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise JobFailure(
            ErrorCode.INVALID_CONFIG, f"cannot read the job spec {path}: {exc}"
        ) from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
            for err in exc.errors()
        )
        raise JobFailure(ErrorCode.INVALID_CONFIG, f"invalid job spec: {problems}") from exc


def write_result(outputs_dir: str | Path, result: RuntimeResult) -> Path:
    """Write atomically, so a reader never sees half a verdict."""
    directory = Path(outputs_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILENAME
    partial = directory / f".{RESULT_FILENAME}.partial"
    partial.write_text(result.model_dump_json(indent=2, exclude_none=True))
    os.replace(partial, path)
    return path


def read_result(path: str | Path) -> RuntimeResult | None:
    """The verdict at `path`; None when there is none or it is not a `RuntimeResult`,
    which means the runtime crashed and its log is the only witness."""
    try:
        return RuntimeResult.model_validate_json(Path(path).read_bytes())
    except (OSError, ValidationError):
        return None


def _soft_rlimit(name: str) -> int | None:
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, _ = resource.getrlimit(getattr(resource, name))
    return None if soft == resource.RLIM_INFINITY else soft


def memory_limit(spec: JobSpec | None = None) -> int | None:
    """The job's memory limit: the agent's word in the spec, else this process's
    RLIMIT_DATA (which is how the limit is enforced where no cgroup does it)."""
    if spec is not None and spec.memory_limit_bytes is not None:
        return spec.memory_limit_bytes
    return _soft_rlimit("RLIMIT_DATA")


def memory_failure(detail: str = "", *, spec: JobSpec | None = None) -> JobFailure:
    """A refused allocation: past the job's limit where it has one (RESOURCE_LIMIT), else
    the machine ran out (OUT_OF_MEMORY). GPU memory is the device's, never the limit's:
    callers report that as OUT_OF_MEMORY themselves."""
    limit = memory_limit(spec)
    if limit is not None:
        message = failures.memory_exceeded(limit)
        return JobFailure(ErrorCode.RESOURCE_LIMIT, f"{message} ({detail})" if detail else message)
    return JobFailure(
        ErrorCode.OUT_OF_MEMORY,
        detail or "the job ran out of memory; use smaller batches or a node with more memory",
    )


def _limit_failure(exc: OSError) -> JobFailure | None:
    """A write or an open refused by the job's rlimits, as the tenant should read it."""
    if exc.errno == errno.EFBIG and (size := _soft_rlimit("RLIMIT_FSIZE")) is not None:
        return JobFailure(ErrorCode.RESOURCE_LIMIT, failures.disk_exceeded(size))
    if exc.errno == errno.EMFILE and (files := _soft_rlimit("RLIMIT_NOFILE")) is not None:
        return JobFailure(ErrorCode.RESOURCE_LIMIT, failures.open_files_exceeded(files))
    return None


def peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage if sys.platform == "darwin" else usage * 1024  # KiB on Linux


def log(message: str) -> None:
    """One progress line on stderr, which the agent streams to the tenant."""
    print(message, file=sys.stderr, flush=True)


def _outputs_dir_of(spec_path: Path) -> str:
    """Where to put the verdict on a spec that did not validate: its own word if usable."""
    try:
        raw = json.loads(spec_path.read_bytes())
        return _job_relative(raw["outputs_dir"])
    except Exception:  # any unusable spec falls back to the default
        return "out"


def run_runtime(run: Callable[[JobSpec], RuntimeResult], argv: Sequence[str]) -> int:
    """The `__main__` of every runtime: spec in, result out, 0 for every verdict.

    Exceptions other than `JobFailure`, `MemoryError` and an OSError from one of the
    job's limits propagate: a traceback and a non-zero exit are how a bug in the
    runtime reaches the agent.
    """
    if len(argv) != 1:
        log("usage: python -m gpu_share.agent.runtimes.<runtime> spec.json")
        return 2
    spec_path = Path(argv[0])
    try:
        spec = read_spec(spec_path)
    except JobFailure as failure:
        log(f"failed: {failure.code.value}: {failure.message}")
        write_result(
            _outputs_dir_of(spec_path), RuntimeResult.failure(failure.code, failure.message)
        )
        return 0
    try:
        result = run(spec)
    except JobFailure as failure:
        result = RuntimeResult.failure(failure.code, failure.message)
    except MemoryError:
        limited = memory_failure(spec=spec)
        result = RuntimeResult.failure(limited.code, limited.message)
    except OSError as exc:
        if (limited_by := _limit_failure(exc)) is None:
            raise
        result = RuntimeResult.failure(limited_by.code, limited_by.message)
    if result.error is not None:
        log(f"failed: {result.error.code.value}: {result.error.message}")
    write_result(spec.outputs_dir, result)
    return 0
