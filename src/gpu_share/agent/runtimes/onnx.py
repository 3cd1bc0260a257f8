"""The ONNX runtime (SPEC §1.6): `python -m gpu_share.agent.runtimes.onnx spec.json`.

Everything a tenant can get wrong (a file that is not ONNX, inputs whose names,
shapes or dtypes do not fit the model) is checked before the model runs and
reported with the expected signature, so the message says what to change. A
cuda job runs on CUDA or fails: onnxruntime quietly falls back to the CPU when
its CUDA provider cannot start, and the session's providers are checked after
loading to catch exactly that.
"""

import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from gpu_share.agent.runtimes.npz import (
    Array,
    NpzError,
    NpzTooLarge,
    describe,
    load_npz,
    save_npz,
)
from gpu_share.agent.runtimes.runner import (
    FailureCode,
    JobFailure,
    Metrics,
    Result,
    Runtime,
    Spec,
    inputs_cap,
    log,
    memory_failure,
    memory_limit,
    peak_rss_bytes,
    run_runtime,
)

OUTPUTS_FILENAME = "outputs.npz"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
UNNAMED_ARRAY = "arr_0"  # what numpy.savez calls a positional array
MAX_MESSAGE_CHARS = 1500

TENSOR_DTYPES: dict[str, type[np.generic]] = {
    "float": np.float32,
    "double": np.float64,
    "float16": np.float16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "bool": np.bool_,
    "string": np.str_,
}
TENSOR_TYPE = re.compile(r"^tensor\((\w+)\)$")
ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
OUT_OF_MEMORY_SIGNS = ("bad_alloc", "out of memory", "failed to allocate memory", "alloc_failed")
OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
SUPPORTED_OPTIONS = {"graph_optimization_level"}


def run_onnx(spec: Spec) -> Result:
    if spec.runtime not in (Runtime.ONNX_CPU, Runtime.ONNX_CUDA):
        raise JobFailure(FailureCode.INVALID_CONFIG, f"the onnx runtime cannot run {spec.runtime}")
    session, load_ms = open_session(spec)
    provider = session.get_providers()[0]
    log(
        f"loaded model: {_plural(len(session.get_inputs()), 'input')} "
        f"({signature(session.get_inputs())}) → {_plural(len(session.get_outputs()), 'output')} "
        f"({signature(session.get_outputs())}) in {load_ms} ms on {provider}"
    )

    if spec.inputs is None:
        feeds = zero_feeds(session)
        log(f"inputs: one zero-filled batch: {_feeds_summary(feeds)}")
    else:
        feeds = feeds_from_arrays(session, _load_inputs(Path(spec.inputs), spec))
        log(f"inputs: {_feeds_summary(feeds)}")

    started = time.perf_counter()
    values = run_model(session, feeds)
    compute_ms = _ms_since(started)
    log(f"ran in {compute_ms} ms on {provider}")

    outputs = {
        node.name: output_array(node.name, value)
        for node, value in zip(session.get_outputs(), values, strict=True)
    }
    outputs_path = Path(spec.outputs_dir) / OUTPUTS_FILENAME
    outputs_path.parent.mkdir(parents=True, exist_ok=True)
    save_npz(outputs_path, outputs)
    log(f"wrote {outputs_path} ({outputs_path.stat().st_size} bytes): {_feeds_summary(outputs)}")

    device = "cuda" if provider == CUDA_PROVIDER else "cpu"
    return Result(
        ok=True,
        outputs=str(outputs_path),
        outputs_format="npz",
        metrics=Metrics(
            device=device,
            execution_provider=provider,
            gpu_model=_gpu_model() if device == "cuda" else None,
            load_ms=load_ms,
            compute_ms=compute_ms,
            peak_rss_bytes=peak_rss_bytes(),
        ),
    )


# Loading


def _session_options(spec: Spec) -> Any:
    unknown = set(spec.options) - SUPPORTED_OPTIONS
    if unknown:
        raise JobFailure(
            FailureCode.INVALID_CONFIG,
            f"unknown option(s) for the onnx runtime: {', '.join(sorted(unknown))}; "
            f"supported: {', '.join(sorted(SUPPORTED_OPTIONS))}",
        )
    options = _base_options(spec.threads)
    level = spec.options.get("graph_optimization_level")
    if level is not None:
        if level not in OPTIMIZATION_LEVELS:
            raise JobFailure(
                FailureCode.INVALID_CONFIG,
                f"graph_optimization_level must be one of {', '.join(OPTIMIZATION_LEVELS)}, "
                f"not {level!r}",
            )
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[level]
        )
    return options


def _base_options(threads: int | None) -> Any:
    """What every session of this runtime runs with, the warm-up's included."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: warnings about the graph are noise to tenants
    if threads is not None:
        options.intra_op_num_threads = threads
    # Idle worker threads sleep instead of spinning: on a node's shared cores a spinning
    # thread steals the CPU that the next request (or a neighbour's job) needs, which
    # showed as session p99 (bench/README.md, sessions).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def open_session(spec: Spec) -> tuple[Any, int]:
    model = Path(spec.model)
    if not model.is_file():
        raise JobFailure(FailureCode.INVALID_CONFIG, f"the model file {model} is missing")
    options = _session_options(spec)
    wants_cuda = spec.runtime == Runtime.ONNX_CUDA
    providers = [CUDA_PROVIDER, CPU_PROVIDER] if wants_cuda else [CPU_PROVIDER]
    ort.set_default_logger_severity(3)
    started = time.perf_counter()
    try:
        # onnxruntime warns (UserWarning) rather than fails when CUDA is missing; the
        # provider check below is what decides.
        session = ort.InferenceSession(str(model), sess_options=options, providers=providers)
    except Exception as exc:
        raise _loading_failure(exc, model) from exc
    load_ms = _ms_since(started)

    if wants_cuda and session.get_providers()[0] != CUDA_PROVIDER:
        available = ort.get_available_providers()
        if CUDA_PROVIDER in available:
            reason = (
                f"CUDA execution provider failed to start on this node (onnxruntime "
                f"{ort.__version__} has it, but the session fell back to "
                f"{session.get_providers()[0]}; see the log above for why)"
            )
        else:
            reason = (
                "CUDA execution provider is not available on this node "
                f"(onnxruntime {ort.__version__} providers: {', '.join(available)})"
            )
        raise JobFailure(FailureCode.RUNTIME_ERROR, reason)
    return session, load_ms


def _loading_failure(exc: BaseException, model: Path) -> JobFailure:
    message = _ort_message(exc)
    if _is_out_of_memory(exc):
        return _memory_failure(exc, f"out of memory loading the model: {message}")
    if isinstance(exc, ort_errors.NotImplemented):
        return JobFailure(
            FailureCode.INVALID_MODEL,
            f"the model uses an operator or type that onnxruntime {ort.__version__} "
            f"on this node cannot run: {message}",
        )
    return JobFailure(
        FailureCode.INVALID_MODEL,
        f"model_url did not point to a valid ONNX model: {message}{_file_hint(model)}",
    )


def _file_hint(model: Path) -> str:
    """What the file looks like, for the common mistakes (an HTML page, a checkpoint)."""
    try:
        with model.open("rb") as file:
            head = file.read(64)
    except OSError:
        return ""
    stripped = head.lstrip().lower()
    if not head:
        return " (the file is empty)"
    if stripped.startswith((b"<!doctype", b"<html", b"<?xml")):
        return " (the file is an HTML/XML page, not a model: check that the URL serves the file)"
    if stripped.startswith((b"{", b"[")):
        return " (the file is JSON, not an ONNX model)"
    if head.startswith(b"PK"):
        return " (the file is a zip archive, e.g. a PyTorch checkpoint; export it to ONNX first)"
    return ""


# Inputs


def _load_inputs(path: Path, spec: Spec) -> dict[str, Array]:
    if not path.is_file():
        raise JobFailure(FailureCode.INVALID_CONFIG, f"the inputs file {path} is missing")
    try:
        return load_npz(path, max_bytes=memory_limit(spec), cap=inputs_cap(spec))
    except NpzTooLarge as exc:
        raise JobFailure(FailureCode.RESOURCE_LIMIT, str(exc)) from exc
    except NpzError as exc:
        raise JobFailure(FailureCode.INVALID_INPUTS, str(exc)) from exc


def feeds_from_arrays(session: Any, arrays: dict[str, Array]) -> dict[str, Array]:
    required = {node.name: node for node in session.get_inputs()}
    optional = {node.name: node for node in session.get_overridable_initializers()}
    taken = {**optional, **required}
    expected = signature(session.get_inputs())

    if list(arrays) == [UNNAMED_ARRAY] and UNNAMED_ARRAY not in taken:
        if len(required) != 1:
            raise JobFailure(
                FailureCode.INVALID_INPUTS,
                f"the inputs NPZ holds one unnamed array ({UNNAMED_ARRAY}) but the model takes "
                f"{len(required)} inputs: {expected}; save each under its input name, e.g. "
                f"numpy.savez(f, {', '.join(f'{name}=…' for name in required)})",
            )
        arrays = {next(iter(required)): arrays[UNNAMED_ARRAY]}

    missing = [name for name in required if name not in arrays]
    unexpected = [name for name in arrays if name not in taken]
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"missing {_quoted(missing)}")
        if unexpected:
            problems.append(f"unexpected {_quoted(unexpected)}")
        raise JobFailure(
            FailureCode.INVALID_INPUTS,
            f"the inputs NPZ does not match the model's inputs ({'; '.join(problems)}): the "
            f"model takes {expected} and the NPZ holds "
            f"{', '.join(f'{name}: {describe(a)}' for name, a in arrays.items()) or 'nothing'}; "
            "name each array after its input, e.g. "
            f"numpy.savez(f, {', '.join(f'{name}=…' for name in required)})",
        )
    return {name: _fit_input(taken[name], array) for name, array in arrays.items()}


def _fit_input(node: Any, array: Array) -> Array:
    """The array as the model takes it, cast only where no value can change."""
    expected = node_type(node)
    dtype = tensor_dtype(node)

    def refuse(why: str = "") -> JobFailure:
        return JobFailure(
            FailureCode.INVALID_INPUTS,
            f'input "{node.name}": expected {expected}, got {describe(array)}{why}',
        )

    if dtype is None:
        raise JobFailure(
            FailureCode.INVALID_INPUTS,
            f'input "{node.name}" has type {node.type}, which cannot be fed from an NPZ',
        )
    shape: list[int | str | None] = list(node.shape)
    # onnxruntime reports [] both for a scalar and for a tensor of unknown rank; let it decide.
    if shape:
        if array.ndim != len(shape):
            raise refuse(f" (rank {len(shape)} expected, got {array.ndim})")
        for axis, (want, have) in enumerate(zip(shape, array.shape, strict=True)):
            if isinstance(want, int) and want >= 0 and want != have:
                raise refuse(f" (dimension {axis} must be {want})")

    if dtype is np.str_:
        if array.dtype.kind == "S":
            try:
                return np.char.decode(array.astype(np.bytes_), "utf-8")
            except UnicodeDecodeError as exc:
                raise refuse("; its bytes are not UTF-8 text") from exc
        if array.dtype.kind != "U":
            raise refuse("; save the strings as a numpy str array")
        return array
    if array.dtype == dtype:
        return array
    if array.dtype.kind in "biuf" and np.can_cast(array.dtype, dtype, casting="safe"):
        return array.astype(dtype)
    hint = ""
    if array.dtype.kind in "biuf":
        hint = (
            f"; {array.dtype.name} does not convert to {np.dtype(dtype).name} without loss, "
            f"so convert it yourself with .astype(numpy.{np.dtype(dtype).name})"
        )
    raise refuse(hint)


def zero_feeds(session: Any) -> dict[str, Array]:
    """One batch of zeros shaped like the session's real inputs (initializers excluded)."""
    feeds: dict[str, Array] = {}
    for node in session.get_inputs():
        dtype = tensor_dtype(node)
        if dtype is None:
            raise JobFailure(
                FailureCode.INVALID_INPUTS,
                f'input "{node.name}" has type {node.type}, which cannot be zero-filled; '
                "provide inputs_url",
            )
        shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in node.shape)
        if dtype is np.str_:
            feeds[node.name] = np.full(shape, "", dtype=np.str_)
        else:
            feeds[node.name] = np.zeros(shape, dtype=dtype)
    return feeds


# Running and outputs


def run_model(session: Any, feeds: dict[str, Array]) -> list[Any]:
    try:
        values: list[Any] = session.run(None, feeds)
    except Exception as exc:
        message = _ort_message(exc)
        if _is_out_of_memory(exc):
            raise _memory_failure(
                exc, f"out of memory running the model: {message}; use smaller batches"
            ) from exc
        if isinstance(exc, ort_errors.InvalidArgument):
            raise JobFailure(
                FailureCode.INVALID_INPUTS, f"onnxruntime refused the inputs: {message}"
            ) from exc
        raise JobFailure(
            FailureCode.RUNTIME_ERROR, f"the model failed while running: {message}"
        ) from exc
    return values


def output_array(name: str, value: Any) -> Array:
    """A tensor as is; a sequence or map (e.g. a ZipMap) as a numeric array, or a clear no."""
    try:
        if isinstance(value, np.ndarray):
            return value.astype(np.str_) if value.dtype.hasobject else value
        if isinstance(value, Mapping):
            keys = sorted(value)
            log(f'output "{name}": a map, stored as its values in key order {keys}')
            return _numeric([value[k] for k in keys])
        if isinstance(value, Sequence) and value and all(isinstance(v, Mapping) for v in value):
            keys = sorted(value[0])
            if any(sorted(row) != keys for row in value):
                raise ValueError("its maps do not all have the same keys")
            log(f'output "{name}": a sequence of maps, stored as rows with columns {keys}')
            return _numeric([[row[k] for k in keys] for row in value])
        if isinstance(value, Sequence):
            return _numeric(np.stack([np.asarray(v) for v in value]) if value else [])
        return _numeric(value)
    except (ValueError, TypeError) as exc:
        raise JobFailure(
            FailureCode.INVALID_MODEL,
            f'output "{name}" ({type(value).__name__}) cannot be stored as an NPZ array: {exc}; '
            "export the model with tensor outputs (for skl2onnx classifiers: "
            "options={id(model): {'zipmap': False}})",
        ) from exc


def _numeric(value: Any) -> Array:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"its values are {array.dtype.name}, not numbers")
    return array


# Helpers


def tensor_dtype(node: Any) -> type[np.generic] | None:
    match = TENSOR_TYPE.match(node.type)
    return TENSOR_DTYPES.get(match.group(1)) if match else None


def node_type(node: Any) -> str:
    match = TENSOR_TYPE.match(node.type)
    if not match:
        return str(node.type)
    dtype = TENSOR_DTYPES.get(match.group(1))
    element = match.group(1) if dtype is None else _dtype_label(dtype)
    dims = ",".join("?" if d is None else str(d) for d in node.shape)
    return f"{element}[{dims}]"


def _dtype_label(dtype: type[np.generic]) -> str:
    return "str" if dtype is np.str_ else np.dtype(dtype).name


def signature(nodes: Sequence[Any]) -> str:
    return ", ".join(f"{node.name}: {node_type(node)}" for node in nodes) or "none"


def _feeds_summary(arrays: Mapping[str, Array]) -> str:
    return ", ".join(f"{name}: {describe(array)}" for name, array in arrays.items()) or "none"


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ort_message(exc: BaseException) -> str:
    message = ORT_PREFIX.sub("", str(exc).strip()) or type(exc).__name__
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(sign in text for sign in OUT_OF_MEMORY_SIGNS)


def _memory_failure(exc: BaseException, message: str) -> JobFailure:
    """GPU memory ran out (OUT_OF_MEMORY), or host memory: the job's limit where it has one."""
    if "cuda" in str(exc).lower():
        return JobFailure(FailureCode.OUT_OF_MEMORY, message)
    return memory_failure(message)


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


def _gpu_model() -> str | None:
    """The name of the GPU the job ran on, best effort (pynvml is optional)."""
    try:
        import pynvml
    except ImportError:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        pynvml.nvmlInit()
        try:
            if visible.startswith(("GPU-", "MIG-")):
                handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
            else:
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible or 0))
            name = pynvml.nvmlDeviceGetName(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing, no permission, odd CUDA_VISIBLE_DEVICES: not worth failing
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


WARM_UP_MODEL = bytes.fromhex(
    "08083a3e0a100a017812017922084964656e7469747912086964656e746974795a0f0a0178120a0a0808"
    "0112040a020801620f0a0179120a0a08080112040a02080142040a00100d"
)
"""y = x on one float32 (`testing.models.identity_model(shape=(1,))`, opset 13): the
platform's own model, run once by a warm runtime before it waits for its job."""


def warm_up() -> None:
    """Pay onnxruntime's first session of the process now, ahead of the job: the first
    `InferenceSession` a process makes costs ~3 ms more than any later one (the digits
    model loaded in 3.4–4.4 ms first, 0.5–0.6 ms after this; bench/README.md,
    `dispatch.py`). On the CPU only: a CUDA context held by every waiting process would
    take GPU memory from the node's jobs and sessions."""
    options = _base_options(threads=1)
    session = ort.InferenceSession(WARM_UP_MODEL, sess_options=options, providers=[CPU_PROVIDER])
    session.run(None, {"x": np.zeros(1, dtype=np.float32)})


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if list(argv) == ["--warm"]:  # started ahead of its job (`runtimes/warm.py`)
        from gpu_share.agent.runtimes import warm

        warm_up()  # before it says it is ready: the pool hands over no job meanwhile
        job = warm.wait_for_job()
        if job is None:
            return 0
        warm.exit_now(run_runtime(run_onnx, job))
    return run_runtime(run_onnx, argv)


if __name__ == "__main__":
    from gpu_share.agent.runtimes import warm

    warm.exit_now(main())  # the verdict is written: no interpreter teardown (`exit_now`)
