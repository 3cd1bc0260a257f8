"""The tenant CLI: its output and exit codes against a real server process and agent.

Commands run in-process through `main(argv)` (the same code the `gpu-share` script
runs), and once as a real process; cases that need another server (no nodes) use
the coordinator in-process on a real port.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI

from gpu_share.cli.main import main
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import slow_model, unloadable_model
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

POLL = ("--poll-interval", "0.1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("cli-stack")) as live:
        yield live


@pytest.fixture(scope="module")
def key(stack: LiveStack) -> str:
    return stack.tenant_key("CLI Tenant")


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPU_SHARE_BASE_URL", "GPU_SHARE_API_KEY", "GPU_SHARE_POLL_INTERVAL"):
        monkeypatch.delenv(name, raising=False)


def gpu_share(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def connected(stack: LiveStack, key: str) -> tuple[str, ...]:
    return ("--base-url", stack.base_url, "--api-key", key)


# doctor


def test_doctor_passes_every_check_on_a_working_platform(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(capsys, "doctor", *connected(stack, key), *POLL)
    assert code == 0, out
    lines = out.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("[")] == [
        "server",
        "health",
        "API",
        "nodes",
        "runtimes",
        "smoke",
    ]
    assert "[ok]   server reachable" in out and "[ok]   API key" in out
    assert "[ok]   nodes online      1 of 1 node(s)" in out
    # no GPU here: the CPU runtimes work, the CUDA ones would answer NO_CAPACITY
    assert "[warn] runtimes          onnx_cpu, catboost_cpu" in out or "[ok]   runtimes" in out
    smoke = next(line for line in lines if "smoke invoke" in line)
    assert smoke.startswith("[ok]") and " done on cpu " in smoke


def test_doctor_json_lists_the_checks(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(capsys, "doctor", *connected(stack, key), "--skip-invoke", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True
    assert {c["name"]: c["status"] for c in report["checks"]}["smoke invoke"] == "skip"


async def test_doctor_on_a_server_without_nodes_says_so_and_exits_1(
    app: FastAPI, tenant: TenantHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve(app, lifespan=False) as base_url:
        code = await asyncio.to_thread(
            main, ["doctor", "--base-url", base_url, "--api-key", tenant.key]
        )
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] nodes online      no node is online (0 known)" in out
    assert "fix: wait for a provider to connect a machine" in out
    assert "[skip] smoke invoke" in out


def test_doctor_with_a_wrong_key_exits_2_with_the_fix(
    stack: LiveStack, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(capsys, "doctor", *connected(stack, "gpu_sk_not_a_real_key"))
    assert code == 2
    assert "[ok]   server reachable" in out
    assert "[FAIL] API key           gpu_sk_not… is not accepted" in out
    assert "fix: copy the key again, or ask your admin" in out
    assert "[skip] nodes online" in out


def test_doctor_against_nothing_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, _ = gpu_share(capsys, "doctor", "--base-url", url, "--api-key", "gpu_sk_x")
    assert code == 3
    assert f"[FAIL] server reachable  no answer from {url}" in out
    assert "fix: check --base-url / GPU_SHARE_BASE_URL" in out


def test_doctor_without_a_base_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gpu_share(capsys, "doctor")
    assert code == 2 and "GPU_SHARE_BASE_URL" in out


# discovery


def test_nodes_and_runtimes_as_tables_and_json(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(capsys, "nodes", *connected(stack, key))
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:4] == ["NODE", "STATUS", "VERIFIED", "GPUS"]
    assert row.split()[1] == "online" and "onnx_cpu" in row
    assert row.split()[2] == "no"  # no hardware challenge has passed for its cores yet
    code, out, _ = gpu_share(capsys, "runtimes", *connected(stack, key), "--json")
    assert code == 0
    served = {r["name"]: r["nodes_online"] for r in json.loads(out)}
    assert served["onnx_cpu"] == 1 and served["onnx_cuda"] == 0


def test_probe_url_of_a_private_address_is_not_reachable(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(capsys, "probe-url", *connected(stack, key), "http://10.0.0.1/m")
    assert code == 1 and out.startswith("not reachable:") and "private" in out


# upload, invoke, status, logs, cancel


def test_upload_prints_the_url_and_reuses_identical_bytes(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(
        capsys, "upload", *connected(stack, key), str(DIGITS_MODEL), "--kind", "model"
    )
    assert code == 0 and out.startswith("art_")
    assert f"\nname:    {DIGITS_MODEL.name}\n" in out  # the file's name, sent as ?name=
    assert f"url:     {stack.base_url}/v1/artifacts/art_" in out
    assert "inputs:  input: float32[?,64]\n" in out
    assert "outputs: label: int64[?], probabilities: float32[?,10]" in out
    code, again, _ = gpu_share(
        capsys, "upload", *connected(stack, key), str(DIGITS_MODEL), "--kind", "model", "--json"
    )
    assert code == 0 and json.loads(again)["id"] == out.split()[0]
    assert json.loads(again)["name"] == DIGITS_MODEL.name
    code, renamed, _ = gpu_share(
        capsys,
        "upload",
        *connected(stack, key),
        str(DIGITS_MODEL),
        "--kind",
        "model",
        "--name",
        "runs/7/digits-v2.onnx",
        "--no-reuse",
        "--json",
    )
    assert code == 0 and json.loads(renamed)["name"] == "digits-v2.onnx"


def test_invoke_wait_uploads_runs_and_prints_the_outputs(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "outputs.npz"
    code, out, err = gpu_share(
        capsys,
        "invoke",
        *connected(stack, key),
        "--runtime",
        "onnx_cpu",
        "--model",
        str(DIGITS_MODEL),
        "--inputs",
        str(DIGITS_INPUTS),
        "--wait",
        "--output",
        str(saved),
        *POLL,
    )
    assert code == 0, err
    assert out.splitlines()[0].endswith("  done  onnx_cpu")
    assert f"label: int64[8] = {DIGITS_EXPECTED_LABELS}" in out
    assert "probabilities: float32[8, 10]" in out
    assert err.splitlines()[0].endswith(" queued") and err.splitlines()[-1].endswith(" done")
    with np.load(saved) as outputs:
        assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS


def test_invoke_wait_gets_a_short_job_finished_in_the_submits_answer(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model",
        str(DIGITS_MODEL), "--inputs", str(DIGITS_INPUTS), "--wait", "--poll-interval", "30",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[0].endswith("  done  onnx_cpu")
    # The submit was held (`Prefer: wait=30`) until the job ended: the first status
    # the command saw was the end.
    assert len(err.splitlines()) == 1 and err.strip().endswith(" done"), err


def test_invoke_then_status_logs_and_a_cancel_too_late(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model",
        str(DIGITS_MODEL), "--json",
    )  # fmt: skip
    assert code == 0
    invoke_id = json.loads(out)["id"]
    code, logs, _ = gpu_share(capsys, "logs", *connected(stack, key), invoke_id, "--follow",
                              "--poll-interval", "0.1")  # fmt: skip
    assert code == 0 and "bwrap sandbox" in logs
    code, out, _ = gpu_share(capsys, "status", *connected(stack, key), invoke_id)
    assert code == 0 and out.startswith(f"{invoke_id}  done  onnx_cpu")
    assert "ran on:   cpu (CPUExecutionProvider)" in out
    code, _, err = gpu_share(capsys, "cancel", *connected(stack, key), invoke_id)
    assert code == 1 and "CONFLICT" in err and "already finished" in err


def test_a_failing_invoke_exits_1_with_its_code_and_log_tail(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(unloadable_model())  # an ONNX file onnxruntime refuses to load
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model", str(bad),
        "--wait", *POLL,
    )  # fmt: skip
    assert code == 1
    assert "failed: INVALID_MODEL" in err
    assert "--- last lines of its log ---" in err


def test_an_upload_that_is_not_what_its_kind_says_exits_2_saying_why(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "model.onnx"
    page.write_bytes(b"<html>not a model</html>")  # a download that saved an error page
    code, _, err = gpu_share(capsys, "upload", *connected(stack, key), str(page), "--kind", "model")
    assert code == 2 and "VALIDATION_ERROR" in err
    assert "the file is not an ONNX model: it is text" in err
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model", str(page)
    )
    assert code == 2 and "not an ONNX model" in err  # refused before any job was queued


def test_a_wait_timeout_exits_1_naming_the_invoke_which_can_then_be_canceled(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    slow = tmp_path / "slow.onnx"
    slow.write_bytes(slow_model(100_000_000))
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model", str(slow),
        "--wait", "--wait-timeout", "0.5", *POLL,
    )  # fmt: skip
    assert code == 1
    invoke_id = err.split()[0]  # "<id> queued" came first
    assert f"gave up waiting for invoke {invoke_id}" in err and "keeps going" in err
    code, out, _ = gpu_share(capsys, "cancel", *connected(stack, key), invoke_id, "--json")
    assert code == 0 and json.loads(out)["cancel_requested_at"] is not None


def test_ctrl_c_while_waiting_leaves_the_invoke_running_and_says_how_to_follow_or_cancel_it(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    slow = tmp_path / "slow.onnx"
    slow.write_bytes(slow_model(100_000_000))
    env = {**os.environ, "GPU_SHARE_BASE_URL": stack.base_url, "GPU_SHARE_API_KEY": key}
    cli = subprocess.Popen(
        [sys.executable, "-m", "gpu_share.cli.main", "invoke", "--runtime", "onnx_cpu",
         "--model", str(slow), "--wait", *POLL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # a shell without job control starts background children with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert cli.stderr is not None
        first = cli.stderr.readline()  # "<id> queued": the invoke exists, the CLI waits
        assert first.startswith("inv_"), first + cli.stderr.read()
        invoke_id = first.split()[0]
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if not line.startswith(invoke_id)]  # not "running"
    assert len(said) == 2, err
    assert f"invoke {invoke_id} goes on" in said[0] and f"gpu-share cancel {invoke_id}" in err
    assert f"gpu-share status {invoke_id} --wait" in err
    assert f"gpu-share logs {invoke_id} --follow" in err
    code, out, _ = gpu_share(capsys, "status", *connected(stack, key), invoke_id, "--json")
    assert code == 0 and json.loads(out)["status"] in ("queued", "running")
    code, _, _ = gpu_share(capsys, "cancel", *connected(stack, key), invoke_id)
    assert code == 0
    code, _, err = gpu_share(capsys, "status", *connected(stack, key), invoke_id, "--wait", *POLL)
    assert code == 1 and f"invoke {invoke_id} canceled" in err


def test_no_capacity_unknown_ids_bad_requests_and_keys_have_their_exit_codes(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "https://models.example/model.onnx"
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cuda", "--model", url
    )
    assert code == 1 and "NO_CAPACITY" in err and "Try onnx_cpu, which runs on CPUs" in err
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model", url,
        "--require-verified",
    )  # fmt: skip
    assert code == 1 and "NO_CAPACITY" in err and "require_verified" in err  # none proven
    code, _, err = gpu_share(capsys, "status", *connected(stack, key), "inv_" + "0" * 26)
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = gpu_share(
        capsys, "invoke", *connected(stack, key), "--runtime", "onnx_cpu", "--model", url,
        "--timeout-sec", "0",
    )  # fmt: skip
    assert code == 2 and "timeout_sec" in err
    code, _, err = gpu_share(capsys, "nodes", *connected(stack, "gpu_sk_wrong"))
    assert code == 2 and "check --api-key" in err
    code, out, _ = gpu_share(capsys, "upload", *connected(stack, key), "/no/such/file", "--kind",
                             "inputs", "--json")  # fmt: skip
    assert code == 2 and json.loads(out)["error"]["type"] == "FileNotFoundError"


def test_the_installed_entry_point_reads_its_configuration_from_the_environment(
    stack: LiveStack, key: str
) -> None:
    env = {**os.environ, "GPU_SHARE_BASE_URL": stack.base_url, "GPU_SHARE_API_KEY": key}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "runtimes", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert {r["name"] for r in json.loads(done.stdout)} >= {"onnx_cpu", "onnx_cuda"}
    help_text = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "invoke", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "3  the server could not be reached" in help_text


# session


def test_session_runs_several_inputs_through_one_loaded_model(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = np.load(DIGITS_INPUTS)["input"]
    first, second = tmp_path / "first.npz", tmp_path / "second.npz"
    np.savez(first, input=rows[:2])
    np.savez(second, input=rows[2:5])
    code, out, err = gpu_share(
        capsys,
        "session",
        *connected(stack, key),
        "--runtime",
        "onnx_cpu",
        "--model",
        str(DIGITS_MODEL),
        "--inputs",
        str(first),
        "--inputs",
        str(second),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert code == 0, err
    assert f"label: int64[2] = {DIGITS_EXPECTED_LABELS[:2]}" in out
    assert f"label: int64[3] = {DIGITS_EXPECTED_LABELS[2:5]}" in out
    assert out.rstrip().endswith("closed")
    with np.load(tmp_path / "out" / "second.out.npz") as saved:
        assert saved["label"].tolist() == DIGITS_EXPECTED_LABELS[2:5]


def test_session_with_bad_inputs_exits_2_and_closes(
    stack: LiveStack, key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, not_the_input=np.zeros((1, 64), np.float32))
    code, out, _ = gpu_share(
        capsys,
        "session",
        *connected(stack, key),
        "--runtime",
        "onnx_cpu",
        "--model",
        str(DIGITS_MODEL),
        "--inputs",
        str(wrong),
        "--json",
    )
    assert code == 2
    assert "not_the_input" in json.loads(out)["error"]["message"]
