"""The ONNX runtime as the agent runs it: a real process in a job directory.

Every job here goes through `python -m gpu_share.agent.runtimes.onnx spec.json`
and is judged by its `result.json` and exit code, as the agent judges it.
"""

import contextlib
import importlib.util
import io
import json
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpu_share.agent.runtimes.jobspec import JobSpec, RuntimeResult, read_result, write_spec
from gpu_share.agent.runtimes.npz import load_npz
from gpu_share.agent.runtimes.onnx import WARM_UP_MODEL, _session_options, warm_up
from gpu_share.agent.runtimes.runner import FailureCode, Result, Runtime, Spec, write_result
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.models import identity_model
from tests.agent.runtimes.test_npz import inflating_npz

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@dataclass
class Job:
    directory: Path
    result: RuntimeResult
    returncode: int
    log: str

    def outputs(self) -> dict[str, Any]:
        assert self.result.outputs is not None
        return dict(load_npz(self.directory / self.result.outputs))

    @property
    def error(self) -> tuple[str, str]:
        assert self.result.error is not None, self.log
        return self.result.error.code.value, self.result.error.message


def npz_bytes(*args: Any, **arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, *args, **arrays)
    return buffer.getvalue()


def run_job(
    tmp_path: Path,
    model: Path | bytes,
    inputs: Path | bytes | None,
    *,
    runtime: str = "onnx_cpu",
    spec: dict[str, Any] | None = None,
    rlimits: dict[int, int] | None = None,
) -> Job:
    """`rlimits` are set in the runtime's process, as the supervisor sets a job's."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "model").write_bytes(
        model.read_bytes() if isinstance(model, Path) else model
    )
    if inputs is not None:
        (tmp_path / "in" / "inputs").write_bytes(
            inputs.read_bytes() if isinstance(inputs, Path) else inputs
        )
    body = {
        "runtime": runtime,
        "model": "in/model",
        "inputs": None if inputs is None else "in/inputs",
        "outputs_dir": "out",
        "threads": 1,
        "options": {},
        **(spec or {}),
    }
    (tmp_path / "spec.json").write_text(json.dumps(body))

    def limit() -> None:
        for kind, value in (rlimits or {}).items():
            resource.setrlimit(kind, (value, value))

    done = subprocess.run(
        [sys.executable, "-m", "gpu_share.agent.runtimes.onnx", "spec.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit if rlimits else None,
    )
    outputs_dir = body["outputs_dir"] if isinstance(body["outputs_dir"], str) else "out"
    result = read_result(tmp_path / outputs_dir / "result.json")
    assert result is not None, done.stderr
    return Job(tmp_path, result, done.returncode, done.stderr)


def model_bytes(
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    nodes: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto] | None = None,
    *,
    ml: bool = False,
) -> bytes:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=initializers or [])
    opsets = [helper.make_opsetid("", 17)]
    if ml:
        opsets.append(helper.make_opsetid("ai.onnx.ml", 3))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def two_input_model() -> bytes:
    """y = a + cast(b): a float32[?,3], b int64[?,3]."""
    return model_bytes(
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("b", TensorProto.INT64, [None, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_node("Cast", ["b"], ["b_float"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["a", "b_float"], ["y"]),
        ],
    )


# Success


def test_digits_outputs_match_onnxruntime_in_process_and_sklearn_labels(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, DIGITS_INPUTS)

    assert job.returncode == 0 and job.result.ok, job.log
    assert job.result.outputs == "out/outputs.npz" and job.result.outputs_format == "npz"
    outputs = job.outputs()
    rows = np.load(DIGITS_INPUTS)["input"]
    session = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(None, {"input": rows})
    assert set(outputs) == {"label", "probabilities"}
    np.testing.assert_array_equal(outputs["label"], label)
    np.testing.assert_allclose(outputs["probabilities"], probabilities, rtol=1e-6)

    loader = importlib.util.spec_from_file_location("make_digits", EXAMPLES / "make_digits.py")
    assert loader is not None and loader.loader is not None
    make_digits = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(make_digits)
    classifier, _, _ = make_digits.train()
    np.testing.assert_array_equal(outputs["label"], classifier.predict(rows))


def test_cpu_job_reports_the_cpu_provider_and_its_timings(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, DIGITS_INPUTS)

    metrics = job.result.metrics
    assert metrics is not None
    assert metrics.device == "cpu"
    assert metrics.execution_provider == "CPUExecutionProvider"
    assert metrics.gpu_model is None
    assert metrics.load_ms >= 0 and metrics.compute_ms >= 0
    assert metrics.peak_rss_bytes is not None and metrics.peak_rss_bytes > 10 * 2**20
    assert "loaded model: 1 input (input: float32[?,64])" in job.log
    assert "on CPUExecutionProvider" in job.log


def test_no_inputs_runs_one_zero_filled_batch(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, None)

    assert job.result.ok, job.log
    outputs = job.outputs()
    assert outputs["label"].shape == (1,)
    assert outputs["probabilities"].shape == (1, 10)


def test_zero_fill_feeds_only_real_inputs_when_an_initializer_is_listed_as_input(
    tmp_path: Path,
) -> None:
    weights = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    model = model_bytes(
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [numpy_helper.from_array(weights, "w")],
    )

    job = run_job(tmp_path, model, None)

    assert job.result.ok, job.log
    np.testing.assert_array_equal(job.outputs()["y"], weights[None, :])


def string_model() -> bytes:
    return model_bytes(
        [helper.make_tensor_value_info("words", TensorProto.STRING, [None, 2])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, [None, 2])],
        [helper.make_node("Identity", ["words"], ["same"])],
    )


def test_zero_fill_gives_string_inputs_empty_strings(tmp_path: Path) -> None:
    job = run_job(tmp_path, string_model(), None)

    assert job.result.ok, job.log
    np.testing.assert_array_equal(job.outputs()["same"], np.array([["", ""]]))


def test_string_inputs_come_back_as_str_arrays(tmp_path: Path) -> None:
    words = np.array([[b"caf\xc3\xa9", b"gpu"]])  # UTF-8 bytes are decoded to str

    job = run_job(tmp_path, string_model(), npz_bytes(words=words))

    assert job.result.ok, job.log
    np.testing.assert_array_equal(job.outputs()["same"], np.array([["café", "gpu"]]))


def test_single_unnamed_array_feeds_a_single_input_model(tmp_path: Path) -> None:
    rows = np.load(DIGITS_INPUTS)["input"]

    job = run_job(tmp_path, DIGITS_MODEL, npz_bytes(rows))

    assert job.result.ok, job.log
    assert job.outputs()["label"].shape == (8,)


def test_lossless_int32_to_int64_cast_is_accepted(tmp_path: Path) -> None:
    a = np.ones((2, 3), dtype=np.float32)
    b = np.arange(6, dtype=np.int32).reshape(2, 3)

    job = run_job(tmp_path, two_input_model(), npz_bytes(a=a, b=b))

    assert job.result.ok, job.log
    np.testing.assert_array_equal(job.outputs()["y"], a + b)


def test_sequence_of_maps_output_is_stored_as_rows(tmp_path: Path) -> None:
    model = model_bytes(
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 3])],
        [
            helper.make_value_info(
                "by_class",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(
                        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
                    )
                ),
            )
        ],
        [
            helper.make_node(
                "ZipMap",
                ["scores"],
                ["by_class"],
                domain="ai.onnx.ml",
                classlabels_int64s=[2, 0, 1],
            )
        ],
        ml=True,
    )
    scores = np.array([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]], dtype=np.float32)

    job = run_job(tmp_path, model, npz_bytes(scores=scores))

    assert job.result.ok, job.log
    # Columns in key order: class 0, 1, 2 were the 2nd, 3rd and 1st score.
    np.testing.assert_allclose(job.outputs()["by_class"], scores[:, [1, 2, 0]], rtol=1e-6)


# Failures the tenant can fix: result.json says what, and the process exits 0


def test_unnamed_array_on_a_two_input_model_names_the_expected_inputs(tmp_path: Path) -> None:
    job = run_job(tmp_path, two_input_model(), npz_bytes(np.ones((2, 3), np.float32)))

    code, message = job.error
    assert job.returncode == 0
    assert code == "INVALID_INPUTS"
    assert "a: float32[?,3], b: int64[?,3]" in message
    assert "numpy.savez(f, a=…, b=…)" in message


DIGIT_ROWS = np.zeros((5, 64), dtype=np.float32)


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        pytest.param(
            npz_bytes(pixels=DIGIT_ROWS),
            ['missing "input"', 'unexpected "pixels"', "input: float32[?,64]"],
            id="wrong-name",
        ),
        pytest.param(
            npz_bytes(input=DIGIT_ROWS, extra=DIGIT_ROWS),
            ['unexpected "extra"'],
            id="extra-array",
        ),
        pytest.param(
            npz_bytes(input=np.zeros(64, np.float32)),
            ['input "input": expected float32[?,64], got float32[64] (rank 2 expected, got 1)'],
            id="wrong-rank",
        ),
        pytest.param(
            npz_bytes(input=np.zeros((5, 63), np.float32)),
            ['input "input": expected float32[?,64], got float32[5,63] (dimension 1 must be 64)'],
            id="wrong-dimension",
        ),
        pytest.param(
            npz_bytes(input=np.zeros((5, 64), np.float64)),
            ['input "input": expected float32[?,64], got float64[5,64]', ".astype(numpy.float32)"],
            id="float64-for-float32",
        ),
        pytest.param(
            npz_bytes(input=np.array([[{"a": 1}]], dtype=object)),
            ['array "input" holds Python objects (dtype=object)'],
            id="object-array",
        ),
        pytest.param(
            npz_bytes(input=DIGIT_ROWS)[:100], ["corrupt NPZ archive"], id="truncated-npz"
        ),
        pytest.param(b"input,1,2,3\n", ["not an NPZ archive", "numpy.savez"], id="csv-not-npz"),
    ],
)
def test_inputs_that_do_not_fit_the_model_fail_with_invalid_inputs(
    tmp_path: Path, inputs: bytes, fragments: list[str]
) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, inputs)

    code, message = job.error
    assert job.returncode == 0
    assert code == "INVALID_INPUTS"
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        pytest.param(b"\x08\x07garbage\xff\xff not a protobuf", "", id="garbage"),
        pytest.param(b"<!DOCTYPE html><html>Sign in</html>", "HTML", id="html-page"),
    ],
)
def test_a_file_that_is_not_onnx_fails_with_invalid_model(
    tmp_path: Path, model: bytes, fragment: str
) -> None:
    job = run_job(tmp_path, model, None)

    code, message = job.error
    assert job.returncode == 0
    assert code == "INVALID_MODEL"
    assert message.startswith("model_url did not point to a valid ONNX model: ")
    assert fragment in message


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="this node has CUDA"
)
def test_cuda_job_on_a_cpu_only_node_fails_instead_of_running_on_cpu(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, DIGITS_INPUTS, runtime="onnx_cuda")

    code, message = job.error
    assert job.returncode == 0
    assert code == "RUNTIME_ERROR"
    assert message.startswith("CUDA execution provider is not available on this node")
    assert "CPUExecutionProvider" in message
    assert not (tmp_path / "out" / "outputs.npz").exists()


def test_unknown_option_fails_with_invalid_config(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, None, spec={"options": {"batch_size": 4}})

    code, message = job.error
    assert code == "INVALID_CONFIG"
    assert "batch_size" in message and "graph_optimization_level" in message


def test_invalid_spec_is_reported_in_the_outputs_dir_it_names(tmp_path: Path) -> None:
    job = run_job(tmp_path, DIGITS_MODEL, None, spec={"outputs_dir": "results", "threads": 0})

    code, message = job.error
    assert job.returncode == 0
    assert code == "INVALID_CONFIG"
    assert "threads" in message


# Limits: the job's, named in the failure


def zeros_model() -> bytes:
    """y = zeros(shape): as much memory, and output, as the inputs ask for."""
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    return model_bytes(
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)],
    )


def test_an_allocation_past_the_memory_rlimit_fails_naming_the_limit(tmp_path: Path) -> None:
    gib_of_floats = npz_bytes(shape=np.array([256 * 1024 * 1024], dtype=np.int64))
    job = run_job(
        tmp_path, zeros_model(), gib_of_floats, rlimits={resource.RLIMIT_DATA: 256 * 1024 * 1024}
    )
    code, message = job.error
    assert (job.returncode, code) == (0, "RESOURCE_LIMIT"), job.log
    assert message.startswith("the job used more than its 256 MiB of memory")


def test_inputs_that_expand_past_the_jobs_memory_are_refused_unread(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, shape=np.zeros(8 * 1024 * 1024, dtype=np.int64))
    job = run_job(
        tmp_path, zeros_model(), buffer.getvalue(), spec={"memory_limit_bytes": 16 * 1024 * 1024}
    )
    code, message = job.error
    assert code == "RESOURCE_LIMIT", job.log
    assert "the inputs NPZ expands to 64 MiB, more than this job's 16 MiB of memory" in message


def test_outputs_past_the_disk_limit_fail_naming_the_limit(tmp_path: Path) -> None:
    four_mib = npz_bytes(shape=np.array([1024 * 1024], dtype=np.int64))
    job = run_job(tmp_path, zeros_model(), four_mib, rlimits={resource.RLIMIT_FSIZE: 1024 * 1024})
    code, message = job.error
    assert (job.returncode, code) == (0, "RESOURCE_LIMIT"), job.log
    assert message.startswith("the job wrote more than its 1 MiB of disk")


# The shared contract


def test_spec_paths_must_stay_inside_the_job_directory() -> None:
    with pytest.raises(ValueError, match="inside the job directory"):
        JobSpec(runtime=RuntimeName.ONNX_CPU, model="../other-job/in/model")
    with pytest.raises(ValueError, match="inside the job directory"):
        JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model", outputs_dir="/tmp/out")


def test_result_round_trips_and_a_missing_or_invalid_one_reads_as_none(tmp_path: Path) -> None:
    spec = JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model")
    assert JobSpec.model_validate_json(write_spec(tmp_path, spec).read_text()) == spec
    assert read_result(tmp_path / spec.result_path) is None

    failure = Result.failure(FailureCode.INVALID_INPUTS, "input x: expected float32[?,3]")
    assert read_result(write_result(tmp_path / spec.outputs_dir, failure)) == (
        RuntimeResult.failure(ErrorCode.INVALID_INPUTS, "input x: expected float32[?,3]")
    )

    (tmp_path / spec.result_path).write_text('{"ok": true}')  # success without outputs
    assert read_result(tmp_path / spec.result_path) is None


def test_idle_intra_op_threads_sleep_rather_than_spin() -> None:
    options = _session_options(Spec(runtime=Runtime.ONNX_CPU, model="m.onnx", threads=2))

    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"


@pytest.fixture(scope="module")
def three_gib_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 MiB of deflated zeros whose one array (float64, honestly declared) is 3 GiB."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    return inflating_npz(path, shape=(3 * 2**30 // 8,))


def peak_rss_of(argv: list[str], cwd: Path) -> tuple[int, int]:
    """(exit code, the highest RSS seen) of a process, sampled every 10 ms: a loose bound."""
    process = psutil.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, process.memory_info().rss)
        time.sleep(0.01)
    return process.wait(60), peak


def test_a_3_mib_npz_inflating_to_3_gib_fails_fast_from_its_headers_in_little_memory(
    tmp_path: Path, three_gib_bomb: Path
) -> None:
    """On a node whose jobs may use 16 GiB, MAX_INPUTS_EXPANDED_BYTES (2 GiB by default)
    is the limit: refused from the headers, never inflated."""
    assert three_gib_bomb.stat().st_size < 4 * 2**20
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "model").write_bytes(zeros_model())
    shutil.copy(three_gib_bomb, tmp_path / "in" / "inputs")
    spec = {"runtime": "onnx_cpu", "model": "in/model", "inputs": "in/inputs", "threads": 1}
    (tmp_path / "spec.json").write_text(json.dumps({**spec, "memory_limit_bytes": 16 * 2**30}))
    argv = [sys.executable, "-m", "gpu_share.agent.runtimes.onnx", "spec.json"]
    returncode, peak = peak_rss_of(argv, tmp_path)
    result = read_result(tmp_path / "out" / "result.json")
    assert returncode == 0 and result is not None and result.error is not None
    assert result.error.code.value == "RESOURCE_LIMIT"
    assert result.error.message.startswith(
        "the inputs NPZ expands to 3072 MiB, more than the 2048 MiB this node lets any job's "
        "inputs expand to (MAX_INPUTS_EXPANDED_BYTES"
    ), result.error.message
    assert '"x": float64[402653184]' in result.error.message
    assert peak < 500 * 2**20, f"the runtime's RSS peaked at {peak / 2**20:.0f} MiB"

    # The agent's own setting, when smaller than the job's memory, is the one named.
    (tmp_path / "spec.json").write_text(
        json.dumps({**spec, "memory_limit_bytes": 16 * 2**30, "max_inputs_expanded_bytes": 2**30})
    )
    assert peak_rss_of(argv, tmp_path)[0] == 0
    result = read_result(tmp_path / "out" / "result.json")
    assert result is not None and result.error is not None
    assert "more than the 1024 MiB this node lets" in result.error.message


def test_the_warm_up_model_is_the_one_value_identity_it_says_and_runs() -> None:
    # A warm runtime loads it before its job (`onnx.warm_up`): the platform's own bytes,
    # never a tenant's, and a model onnxruntime runs.
    assert identity_model(shape=(1,)) == WARM_UP_MODEL
    onnx.checker.check_model(onnx.load_from_string(WARM_UP_MODEL))
    warm_up()
