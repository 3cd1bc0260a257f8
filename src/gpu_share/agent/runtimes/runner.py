"""The runtime's side of the job contract: `spec.json` in, `result.json` out.

The runtime process starts once per job, so every module it imports is paid on every
invoke. This one uses the standard library only: the spec is read with `json` and
checked here, field by field, with the words pydantic would use, and the verdict is
written as plain JSON. The agent side (`jobspec`) keeps the pydantic models: it
validates the spec before writing it and the verdict after reading it, so a shape
the two disagree on is refused where it is read. `tests/agent/runtimes/test_imports.py`
pins that they agree and that no runtime imports pydantic or `gpu_share.protocol`.

A runtime module is a `run(spec) -> Result` function handed to `run_runtime`, which
owns the parts every runtime shares: reading the spec, turning a `JobFailure` into a
failed result, writing `result.json` atomically and exiting 0 for every verdict the
tenant can act on.
"""

import errno
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, Self

from gpu_share.agent.runtimes import limit_messages

SPEC_FILENAME = "spec.json"
RESULT_FILENAME = "result.json"
# The agent's MAX_INPUTS_EXPANDED_BYTES by default (`AgentSettings.max_inputs_expanded_bytes`)
DEFAULT_MAX_INPUTS_EXPANDED_BYTES = 2 * 1024**3


class Runtime(StrEnum):
    """`gpu_share.protocol.runtimes.RuntimeName`, without importing the protocol."""

    ONNX_CUDA = "onnx_cuda"
    ONNX_CPU = "onnx_cpu"
    CATBOOST_CUDA = "catboost_cuda"
    CATBOOST_CPU = "catboost_cpu"


class FailureCode(StrEnum):
    """The `ErrorCode`s a runtime may fail with; anything else is the agent's to decide."""

    INVALID_MODEL = "INVALID_MODEL"
    INVALID_INPUTS = "INVALID_INPUTS"
    INVALID_CONFIG = "INVALID_CONFIG"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"


class JobFailure(Exception):
    """A verdict the tenant can act on; `run_runtime` writes it as a failed result."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def job_relative(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{value!r} must be a path inside the job directory, such as in/model")
    return value


# The spec


@dataclass(frozen=True)
class Spec:
    """`spec.json`: what to run, written by the agent (`jobspec.JobSpec`)."""

    runtime: Runtime
    model: str  # the model file (ONNX) or train config (CatBoost)
    inputs: str | None = None  # NPZ of inputs; None: zero-filled
    outputs_dir: str = "out"
    threads: int | None = None  # intra-op threads
    memory_limit_bytes: int | None = None  # inputs that expand past it are refused unread
    # MAX_INPUTS_EXPANDED_BYTES: the most the inputs may expand to; None: the default
    max_inputs_expanded_bytes: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # runtime-specific

    @property
    def result_path(self) -> Path:
        return Path(self.outputs_dir) / RESULT_FILENAME


class _Invalid(ValueError):
    """One field's problem, in pydantic's words (the agent's side reports them so)."""


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid("Input should be a valid string")
    return value


def _integer(value: Any, *, ge: int | None = None, le: int | None = None) -> int:
    if isinstance(value, bool | int):
        number = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Invalid("Input should be a finite number")
        if not value.is_integer():
            raise _Invalid("Input should be a valid integer, got a number with a fractional part")
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise _Invalid(
                "Input should be a valid integer, unable to parse string as an integer"
            ) from None
    else:
        raise _Invalid("Input should be a valid integer")
    if ge is not None and number < ge:
        raise _Invalid(f"Input should be greater than or equal to {ge}")
    if le is not None and number > le:
        raise _Invalid(f"Input should be less than or equal to {le}")
    return number


def _path(value: Any) -> str:
    try:
        return job_relative(_string(value))
    except _Invalid:
        raise
    except ValueError as exc:
        raise _Invalid(f"Value error, {exc}") from None


def _runtime(value: Any) -> Runtime:
    try:
        return Runtime(value)
    except ValueError:
        names = [f"'{name.value}'" for name in Runtime]
        raise _Invalid(f"Input should be {', '.join(names[:-1])} or {names[-1]}") from None


def _options(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid("Input should be an object")
    return value


# Field: (required, the check of a value that is not None, whether None is allowed).
_FIELDS: dict[str, tuple[bool, Callable[[Any], Any], bool]] = {
    "runtime": (True, _runtime, False),
    "model": (True, _path, False),
    "inputs": (False, _path, True),
    "outputs_dir": (False, _path, False),
    "threads": (False, lambda v: _integer(v, ge=1, le=1024), True),
    "memory_limit_bytes": (False, lambda v: _integer(v, ge=1), True),
    "max_inputs_expanded_bytes": (False, lambda v: _integer(v, ge=1), True),
    "options": (False, _options, False),
}


def parse_spec(raw: Any) -> Spec:
    """The spec from parsed JSON; raises ValueError listing every problem, as
    `problem; problem`, each `field: what is wrong` (`spec: …` for the whole)."""
    if not isinstance(raw, dict):
        raise ValueError("spec: Input should be an object")
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, (required, check, nullable) in _FIELDS.items():
        if name not in raw:
            if required:
                problems.append(f"{name}: Field required")
            continue
        value = raw[name]
        try:
            values[name] = None if value is None and nullable else check(value)
        except _Invalid as exc:
            problems.append(f"{name}: {exc}")
    problems += [f"{name}: Extra inputs are not permitted" for name in raw if name not in _FIELDS]
    if problems:
        raise ValueError("; ".join(problems))
    return Spec(**values)


def read_spec(path: Path) -> Spec:
    """Raises `JobFailure(INVALID_CONFIG)`: a spec the runtime cannot follow."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JobFailure(
            FailureCode.INVALID_CONFIG, f"cannot read the job spec {path}: {exc}"
        ) from exc
    try:
        raw = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not text
        raise JobFailure(
            FailureCode.INVALID_CONFIG, f"invalid job spec: spec: Invalid JSON: {exc}"
        ) from exc
    try:
        return parse_spec(raw)
    except ValueError as exc:
        raise JobFailure(FailureCode.INVALID_CONFIG, f"invalid job spec: {exc}") from exc


# The verdict


@dataclass(frozen=True)
class Metrics:
    device: str  # what really ran the job: cpu or cuda
    load_ms: int  # reading the model and preparing to run
    compute_ms: int  # running it, without loading
    execution_provider: str | None = None
    gpu_model: str | None = None
    peak_rss_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # runtime-specific

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, not {self.device!r}")

    def as_json(self) -> dict[str, Any]:
        """In `jobspec.RuntimeMetrics`'s field order, None left out."""
        fields = {
            "device": self.device,
            "execution_provider": self.execution_provider,
            "gpu_model": self.gpu_model,
            "load_ms": self.load_ms,
            "compute_ms": self.compute_ms,
            "peak_rss_bytes": self.peak_rss_bytes,
            "extra": self.extra,
        }
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class Failure:
    code: FailureCode
    message: str  # what went wrong and what to change, for the tenant


@dataclass(frozen=True)
class Result:
    """`<outputs_dir>/result.json`: the verdict (`jobspec.RuntimeResult` on the agent's side)."""

    ok: bool
    outputs: str | None = None  # path of the outputs file, job-relative
    outputs_format: str | None = None  # npz, …
    metrics: Metrics | None = None
    error: Failure | None = None

    def __post_init__(self) -> None:
        if self.ok and (self.error is not None or self.outputs is None or self.metrics is None):
            raise ValueError("a successful result has outputs and metrics and no error")
        if not self.ok and self.error is None:
            raise ValueError("a failed result carries an error")

    @classmethod
    def failure(cls, code: FailureCode, message: str) -> Self:
        return cls(ok=False, error=Failure(code, message))

    def as_json(self) -> dict[str, Any]:
        """In `jobspec.RuntimeResult`'s field order, None left out."""
        fields: dict[str, Any] = {
            "ok": self.ok,
            "outputs": self.outputs,
            "outputs_format": self.outputs_format,
            "metrics": None if self.metrics is None else self.metrics.as_json(),
            "error": None
            if self.error is None
            else {"code": self.error.code.value, "message": self.error.message},
        }
        return {key: value for key, value in fields.items() if value is not None}


def write_result(outputs_dir: str | Path, result: Result) -> Path:
    """Write atomically, so a reader never sees half a verdict."""
    directory = Path(outputs_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILENAME
    partial = directory / f".{RESULT_FILENAME}.partial"
    partial.write_text(json.dumps(result.as_json(), indent=2, ensure_ascii=False))
    os.replace(partial, path)
    return path


# Limits and progress


def _soft_rlimit(name: str) -> int | None:
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, _ = resource.getrlimit(getattr(resource, name))
    return None if soft == resource.RLIM_INFINITY else soft


def memory_limit(spec: Spec | None = None) -> int | None:
    """The job's memory limit: the agent's word in the spec, else this process's
    RLIMIT_DATA (which is how the limit is enforced where no cgroup does it)."""
    if spec is not None and spec.memory_limit_bytes is not None:
        return spec.memory_limit_bytes
    return _soft_rlimit("RLIMIT_DATA")


def inputs_cap(spec: Spec | None = None) -> int:
    """The most a job's inputs NPZ may expand to, whatever its memory: the agent's
    MAX_INPUTS_EXPANDED_BYTES in the spec, else its default."""
    if spec is not None and spec.max_inputs_expanded_bytes is not None:
        return spec.max_inputs_expanded_bytes
    return DEFAULT_MAX_INPUTS_EXPANDED_BYTES


def memory_failure(detail: str = "", *, spec: Spec | None = None) -> JobFailure:
    """A refused allocation: past the job's limit where it has one (RESOURCE_LIMIT), else
    the machine ran out (OUT_OF_MEMORY). GPU memory is the device's, never the limit's:
    callers report that as OUT_OF_MEMORY themselves."""
    limit = memory_limit(spec)
    if limit is not None:
        message = limit_messages.memory_exceeded(limit)
        return JobFailure(
            FailureCode.RESOURCE_LIMIT, f"{message} ({detail})" if detail else message
        )
    return JobFailure(
        FailureCode.OUT_OF_MEMORY,
        detail or "the job ran out of memory; use smaller batches or a node with more memory",
    )


def _limit_failure(exc: OSError) -> JobFailure | None:
    """A write or an open refused by the job's rlimits, as the tenant should read it."""
    if exc.errno == errno.EFBIG and (size := _soft_rlimit("RLIMIT_FSIZE")) is not None:
        return JobFailure(FailureCode.RESOURCE_LIMIT, limit_messages.disk_exceeded(size))
    if exc.errno == errno.EMFILE and (files := _soft_rlimit("RLIMIT_NOFILE")) is not None:
        return JobFailure(FailureCode.RESOURCE_LIMIT, limit_messages.open_files_exceeded(files))
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
        return job_relative(raw["outputs_dir"])
    except Exception:  # any unusable spec falls back to the default
        return "out"


RESULT_WRITTEN_LINE = "gpu-share: result written"
"""A runtime's last line, once its verdict (`result.json`) and its outputs are written and
closed: the agent may read them now, not when the process tree has ended (~5 ms later,
the kernel unmapping the runtime and the sandbox's layers exiting; `running.py`)."""


def _deliver(outputs_dir: str | Path, result: Result) -> int:
    write_result(outputs_dir, result)
    log(RESULT_WRITTEN_LINE)
    return 0


def run_runtime(run: Callable[[Spec], Result], argv: Sequence[str]) -> int:
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
        return _deliver(_outputs_dir_of(spec_path), Result.failure(failure.code, failure.message))
    try:
        result = run(spec)
    except JobFailure as failure:
        result = Result.failure(failure.code, failure.message)
    except MemoryError:
        limited = memory_failure(spec=spec)
        result = Result.failure(limited.code, limited.message)
    except OSError as exc:
        if (limited_by := _limit_failure(exc)) is None:
            raise
        result = Result.failure(limited_by.code, limited_by.message)
    if result.error is not None:
        log(f"failed: {result.error.code.value}: {result.error.message}")
    return _deliver(spec.outputs_dir, result)
