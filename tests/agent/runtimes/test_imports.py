"""The runtime process imports only what runs the job, and still speaks the agent's contract.

It starts once per job, so each module it imports is paid on every invoke: the ONNX
runtimes read `spec.json` and write `result.json` with the standard library
(`runner`) while the agent keeps its pydantic models (`jobspec`). The second half
pins that the two sides agree, field for field and word for word.
"""

import json
import shutil
import struct
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpu_share.agent.runtimes import onnx_session, runner
from gpu_share.agent.runtimes.jobspec import JobSpec, RuntimeFailureCode, RuntimeResult
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol import sessions as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName

# What the ONNX runtimes may import of ours: the runtimes package and nothing above it,
# but for the one NPZ reader (light: numpy and the standard library).
ALLOWED_OURS = {
    "gpu_share",
    "gpu_share._version",
    "gpu_share.npz_reading",
    "gpu_share.agent",
    "gpu_share.agent.runtimes",
    "gpu_share.agent.runtimes.limit_messages",
    "gpu_share.agent.runtimes.npz",
    "gpu_share.agent.runtimes.runner",
    "gpu_share.agent.runtimes.onnx",
    "gpu_share.agent.runtimes.onnx_session",
}


def modules_after(code: str, cwd: Path) -> set[str]:
    """`sys.modules` of a fresh interpreter once `code` has run in `cwd`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def digits_job(directory: Path, *, inputs: bytes | None = None) -> None:
    (directory / "in").mkdir()
    shutil.copy(DIGITS_MODEL, directory / "in" / "model")
    if inputs is None:
        shutil.copy(DIGITS_INPUTS, directory / "in" / "inputs")
    else:
        (directory / "in" / "inputs").write_bytes(inputs)
    spec = JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model", inputs="in/inputs", threads=1)
    (directory / "spec.json").write_text(spec.model_dump_json())


def assert_light(modules: set[str]) -> None:
    assert not {m for m in modules if m == "pydantic" or m.startswith("pydantic.")}
    assert not {m for m in modules if m.startswith("gpu_share.protocol")}
    ours = {m for m in modules if m == "gpu_share" or m.startswith("gpu_share.")}
    assert ours <= ALLOWED_OURS, ours - ALLOWED_OURS


@pytest.mark.parametrize("inputs", [None, b"not an npz"], ids=["digits", "bad-inputs"])
def test_an_onnx_job_imports_neither_pydantic_nor_the_protocol(
    tmp_path: Path, inputs: bytes | None
) -> None:
    digits_job(tmp_path, inputs=inputs)
    modules = modules_after(
        "from gpu_share.agent.runtimes.onnx import main\nassert main(['spec.json']) == 0",
        tmp_path,
    )

    assert_light(modules)
    verdict = json.loads((tmp_path / "out" / "result.json").read_text())
    assert verdict["ok"] is (inputs is None), verdict


def test_a_job_refused_for_its_spec_imports_neither(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text('{"runtime": "onnx_cpu", "model": "/etc/passwd"}')
    modules = modules_after(
        "from gpu_share.agent.runtimes.onnx import main\nassert main(['spec.json']) == 0",
        tmp_path,
    )

    assert_light(modules)
    assert json.loads((tmp_path / "out" / "result.json").read_text())["error"]["code"] == (
        "INVALID_CONFIG"
    )


def test_the_session_process_imports_neither(tmp_path: Path) -> None:
    assert_light(modules_after("import gpu_share.agent.runtimes.onnx_session", tmp_path))


def test_catboost_imports_no_protocol_and_no_agent_module(tmp_path: Path) -> None:
    """CatBoost's train config is the tenant's and keeps pydantic's checks and words;
    a training runs for seconds to hours, so its import does not count."""
    modules = modules_after("import gpu_share.agent.runtimes.catboost", tmp_path)
    ours = {m for m in modules if m.startswith("gpu_share.")}
    assert not {m for m in ours if m.startswith("gpu_share.protocol")}
    assert {m for m in ours if not m.startswith("gpu_share.agent.runtimes")} <= ALLOWED_OURS


def test_importing_the_package_costs_nothing(tmp_path: Path) -> None:
    modules = modules_after("import gpu_share.agent.runtimes", tmp_path)
    assert not {m for m in modules if m.startswith(("pydantic", "numpy", "gpu_share.protocol"))}
    assert {m for m in modules if m.startswith("gpu_share")} <= {
        "gpu_share",
        "gpu_share._version",
        "gpu_share.agent",
        "gpu_share.agent.runtimes",
    }


# The two sides of the contract agree


def test_runtime_names_and_failure_codes_are_the_protocols() -> None:
    assert [name.value for name in runner.Runtime] == [name.value for name in RuntimeName]
    assert [code.value for code in runner.FailureCode] == [
        code.value for code in typing.get_args(RuntimeFailureCode)
    ]
    assert all(ErrorCode(code.value) for code in runner.FailureCode)


GOOD = {"runtime": "onnx_cpu", "model": "in/model"}
SPECS: list[Any] = [
    GOOD,
    {**GOOD, "inputs": "in/inputs", "outputs_dir": "results", "threads": 4, "options": {"a": 1}},
    {**GOOD, "inputs": None, "threads": None, "memory_limit_bytes": None},
    {**GOOD, "threads": "3", "memory_limit_bytes": 2.0},
    {**GOOD, "threads": " 7 ", "memory_limit_bytes": True},
    {**GOOD, "threads": 0},
    {**GOOD, "threads": 2000, "memory_limit_bytes": 0},
    {**GOOD, "max_inputs_expanded_bytes": 1024, "memory_limit_bytes": 2048},
    {**GOOD, "max_inputs_expanded_bytes": 0},
    {**GOOD, "max_inputs_expanded_bytes": "2G"},
    {**GOOD, "threads": 1.5},
    {**GOOD, "threads": "many"},
    {**GOOD, "threads": [1]},
    {**GOOD, "outputs_dir": None},
    {**GOOD, "outputs_dir": "../elsewhere", "inputs": ""},
    {**GOOD, "model": "/etc/passwd"},
    {**GOOD, "model": 5},
    {**GOOD, "options": []},
    {**GOOD, "runtime": "tensorflow"},
    {**GOOD, "runtime": None},
    {"zzz": 1, "model": None},
    {**GOOD, "batch": 4, "threads": 0},
    [],
    "spec",
]


def pydantic_verdict(raw: Any) -> dict[str, Any] | str:
    """What the runtime read from `raw` when it validated with pydantic: the spec, or
    its message."""
    try:
        spec = JobSpec.model_validate_json(json.dumps(raw))
    except ValidationError as exc:
        return "INVALID_CONFIG: invalid job spec: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}"
            for err in exc.errors()
        )
    return spec.model_dump(mode="json")


def runner_verdict(raw: Any, path: Path) -> dict[str, Any] | str:
    path.write_text(json.dumps(raw))
    try:
        spec = runner.read_spec(path)
    except runner.JobFailure as failure:
        return f"{failure.code.value}: {failure.message}"
    return {
        "runtime": spec.runtime.value,
        "model": spec.model,
        "inputs": spec.inputs,
        "outputs_dir": spec.outputs_dir,
        "threads": spec.threads,
        "memory_limit_bytes": spec.memory_limit_bytes,
        "max_inputs_expanded_bytes": spec.max_inputs_expanded_bytes,
        "options": spec.options,
    }


@pytest.mark.parametrize("raw", SPECS, ids=[json.dumps(raw)[:60] for raw in SPECS])
def test_the_runtime_reads_a_spec_as_the_agents_model_does(tmp_path: Path, raw: Any) -> None:
    assert runner_verdict(raw, tmp_path / "spec.json") == pydantic_verdict(raw)


def test_a_spec_that_is_not_json_is_invalid_config(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text("{")
    with pytest.raises(runner.JobFailure, match=r"^invalid job spec: spec: Invalid JSON: "):
        runner.read_spec(path)


def test_the_runtimes_verdict_is_what_the_agents_model_writes(tmp_path: Path) -> None:
    success = runner.Result(
        ok=True,
        outputs="out/outputs.npz",
        outputs_format="npz",
        metrics=runner.Metrics(
            device="cpu",
            execution_provider="CPUExecutionProvider",
            load_ms=5,
            compute_ms=1,
            peak_rss_bytes=123,
            extra={"best_iteration": None, "note": "é"},
        ),
    )
    failure = runner.Result.failure(runner.FailureCode.RESOURCE_LIMIT, "too big: « 5 MiB »")
    for verdict in (success, failure):
        written = runner.write_result(tmp_path / "out", verdict).read_text()
        model = RuntimeResult.model_validate_json(written)
        assert written == model.model_dump_json(indent=2, exclude_none=True)
        assert model.model_dump(mode="json", exclude_none=True) == verdict.as_json()


def test_a_session_answer_is_the_protocols_frame() -> None:
    header = {"type": "forward", "request_id": 7, "session_id": "s-1", "format": "npz"}
    frame = wire.pack(wire.ForwardHeader.model_validate(header), b"payload")
    assert onnx_session.unpack(frame) == wire.unpack(frame)

    answer = {**header, "type": "result", "ok": False}
    answer["error"] = onnx_session.session_error("INVALID_INPUTS", "input «x»: bad")
    ours = onnx_session.pack(answer, b"")
    theirs = wire.pack(wire.ForwardHeader.model_validate(answer), b"")
    assert ours == theirs
    (length,) = struct.unpack(">I", ours[:4])
    assert wire.ForwardHeader.model_validate_json(ours[4 : 4 + length]).error is not None
