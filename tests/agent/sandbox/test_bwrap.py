"""The bubblewrap sandbox, proven by running real jobs under bwrap on this machine.

Without a working bwrap the job tests skip; with GPUSHARE_REQUIRE_BWRAP=1 they fail
instead, so CI cannot pass them silently. The argv tests need no bwrap.
"""

import asyncio
import json
import logging
import os
import secrets
import socket
import stat
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

import gpu_share
from gpu_share.agent.sandbox import SandboxError, SandboxSpec, SandboxUnavailable, detect_sandbox
from gpu_share.agent.sandbox.base import nvidia_minor_numbers
from gpu_share.agent.sandbox.bwrap import (
    BwrapSandbox,
    detect_bwrap,
    python_runtime_paths,
    system_mounts,
)

REQUIRE_BWRAP = os.environ.get("GPUSHARE_REQUIRE_BWRAP") == "1"


@pytest.fixture(scope="module")
def bwrap() -> BwrapSandbox:
    try:
        return detect_bwrap()
    except SandboxUnavailable as exc:
        if REQUIRE_BWRAP:
            pytest.fail(f"GPUSHARE_REQUIRE_BWRAP=1 but {exc}")
        pytest.skip(str(exc))


@dataclass
class Host:
    """An agent's data directory in miniature: two jobs, a cache and a state dir side by side."""

    root: Path
    job_a: Path
    job_b: Path
    secret: Path
    node_key: Path
    blob: Path


@pytest.fixture
def host(tmp_path: Path) -> Host:
    root = tmp_path / "agent-data"
    job_a, job_b = root / "jobs" / "a", root / "jobs" / "b"
    for folder in (job_a, job_b, root / "state", root / "cache"):
        folder.mkdir(parents=True)
    (root / "jobs").chmod(0o700)  # as the agent keeps it: no other user reaches a job
    secret = job_a / "secret.txt"
    secret.write_text("tenant A's data")
    node_key = root / "state" / "node.key"
    node_key.write_text("node private key")
    blob = root / "cache" / "0123abcd"
    blob.write_bytes(b"model bytes")
    return Host(root, job_a, job_b, secret, node_key, blob)


def python_job(job_dir: Path, code: str, **spec: Any) -> SandboxSpec:
    return SandboxSpec(
        argv=[sys.executable, "-c", textwrap.dedent(code)],
        job_dir=job_dir,
        inputs=spec.pop("inputs", {}),
        env=spec.pop("env", {}),
        **spec,
    )


async def run(bwrap: BwrapSandbox, spec: SandboxSpec) -> tuple[int, str]:
    job = await bwrap.start(spec)
    output = await asyncio.wait_for(job.stdout.read(), 30)
    return await asyncio.wait_for(job.wait(), 30), output.decode()


async def run_json(bwrap: BwrapSandbox, spec: SandboxSpec) -> dict[str, Any]:
    code, output = await run(bwrap, spec)
    assert code == 0, output
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


TRY_OPEN = """
import json, os, sys
def attempt(action):
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "ok"
"""


async def test_job_cannot_connect_to_a_port_listening_on_the_host(
    bwrap: BwrapSandbox, host: Host
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # the listener answers from the host
        server.accept()[0].close()
        code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            print("connected")
        except OSError as exc:
            print("blocked", type(exc).__name__)
        """
        status, output = await run(bwrap, python_job(host.job_b, code))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert status == 0
    assert output.startswith("blocked"), output


async def test_job_cannot_resolve_names_and_has_only_loopback(
    bwrap: BwrapSandbox, host: Host
) -> None:
    code = """
    import json, socket
    try:
        socket.getaddrinfo("example.com", 443)
        resolved = True
    except OSError:
        resolved = False
    print(json.dumps({"resolved": resolved, "interfaces": [n for _, n in socket.if_nameindex()]}))
    """
    result = await run_json(bwrap, python_job(host.job_b, code))
    assert result == {"resolved": False, "interfaces": ["lo"]}


async def test_job_writes_only_inside_its_folder(bwrap: BwrapSandbox, host: Host) -> None:
    marker = f"gpushare-marker-{secrets.token_hex(4)}"
    escape = host.root / "escape.txt"
    code = TRY_OPEN + textwrap.dedent(f"""
    def write(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("x")
    targets = {{
        "tmp": "/tmp/{marker}",
        "usr": "/usr/{marker}",
        "etc": "/etc/{marker}",
        "root": "/{marker}",
        "venv": os.path.join(sys.prefix, "{marker}"),
        "package": os.path.join(os.path.dirname(json.__file__), "{marker}"),
        "agent_root": "{escape}",
    }}
    result = {{name: attempt(lambda p=path: write(p)) for name, path in targets.items()}}
    os.makedirs("out", exist_ok=True)
    with open("out/result.txt", "w") as f:
        f.write("done")
    print(json.dumps(result))
    """)
    result = await run_json(bwrap, python_job(host.job_b, code))
    assert result["tmp"] == "ok"  # a private tmpfs …
    assert not Path("/tmp", marker).exists()  # … that the host never sees
    for place in ("usr", "etc", "root", "venv", "package"):
        assert result[place] == "OSError", (place, result)
    assert not Path(sys.prefix, marker).exists()
    assert not escape.exists()  # at most it landed in the sandbox's own /tmp
    assert (host.job_b / "out" / "result.txt").read_text() == "done"


async def test_job_cannot_see_other_jobs_the_cache_or_the_agent_state(
    bwrap: BwrapSandbox, host: Host
) -> None:
    paths = {
        "other_job_file": host.secret,
        "other_job_dir": host.job_a,
        "jobs_root": host.job_a.parent,
        "agent_root": host.root,
        "node_key": host.node_key,
        "cache_blob": host.blob,
    }
    code = TRY_OPEN + textwrap.dedent(f"""
    paths = {json.dumps({k: str(v) for k, v in paths.items()})}
    def read(path):
        if os.path.isdir(path) or not os.path.exists(path):
            os.listdir(path)
        else:
            open(path).read()
    result = {{name: attempt(lambda p=path: read(p)) for name, path in paths.items()}}
    result["parent_listing"] = sorted(os.listdir(".."))
    print(json.dumps(result))
    """)
    result = await run_json(bwrap, python_job(host.job_b, code))
    for name in paths:
        assert result[name] == "FileNotFoundError", (name, result)
    assert "a" not in result["parent_listing"]  # ".." is the sandbox's own root


async def test_inputs_are_readable_but_not_writable_at_in_name(
    bwrap: BwrapSandbox, host: Host
) -> None:
    code = TRY_OPEN + textwrap.dedent("""
    def overwrite():
        with open("in/model.onnx", "wb") as f:
            f.write(b"poisoned")
    result = {
        "content": open("in/model.onnx", "rb").read().decode(),
        "overwrite": attempt(overwrite),
        "remove": attempt(lambda: os.remove("in/model.onnx")),
        "chmod": attempt(lambda: os.chmod("in/model.onnx", 0o666)),
    }
    print(json.dumps(result))
    """)
    spec = python_job(host.job_b, code, inputs={"model.onnx": host.blob})
    result = await run_json(bwrap, spec)
    assert result["content"] == "model bytes"
    assert result["overwrite"] == "OSError"
    assert result["remove"] != "ok"
    assert result["chmod"] == "OSError"
    assert host.blob.read_bytes() == b"model bytes"


async def test_job_runs_as_nobody_in_its_own_pid_namespace(bwrap: BwrapSandbox, host: Host) -> None:
    code = """
    import json, os
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "pids": pids}))
    """
    result = await run_json(bwrap, python_job(host.job_b, code))
    if bwrap.user_namespace:
        assert (result["uid"], result["gid"]) == (65534, 65534)
    assert result["pid"] in (1, 2)
    assert result["pids"] == sorted({1, result["pid"]})


async def test_kill_ends_the_whole_process_tree_promptly(bwrap: BwrapSandbox, host: Host) -> None:
    token = str(900_000_000 + secrets.randbelow(99_999_999))
    code = f"""
    import subprocess, time
    subprocess.Popen(["sleep", "{token}"])
    subprocess.Popen(["sleep", "{token}"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(1000)
    """
    job = await bwrap.start(python_job(host.job_b, code))
    assert await asyncio.wait_for(job.stdout.readline(), 30) == b"ready\n"
    assert len(sleepers(token)) == 2
    started = time.monotonic()
    job.kill()
    status = await asyncio.wait_for(job.wait(), 10)
    while sleepers(token) and time.monotonic() - started < 5:
        await asyncio.sleep(0.05)
    assert sleepers(token) == []
    assert time.monotonic() - started < 5
    assert status < 0
    job.kill()  # idempotent, harmless after exit


def sleepers(token: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and process.info["cmdline"] == [
            "sleep",
            token,
        ]:
            found.append(process.pid)
    return found


async def test_environment_is_clean_and_shows_no_gpu(
    bwrap: BwrapSandbox, host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARE_SECRET_TEST", "agent secret")
    code = """
    import json, os
    print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
    """
    spec = python_job(host.job_b, code, env={"GPUSHARE_JOB": "42"}, cpu_threads=3)
    result = await run_json(bwrap, spec)
    env = result["env"]
    assert isinstance(env, dict)
    assert "GPUSHARE_SECRET_TEST" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["HOME"] == "/job" and result["cwd"] == "/job"
    assert env["GPUSHARE_JOB"] == "42"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["OPENBLAS_NUM_THREADS"] == "1"
    assert set(env) <= {
        *("PATH", "HOME", "LANG", "PYTHONUNBUFFERED", "PWD", "GPUSHARE_JOB"),
        *("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
        *("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"),
    }


async def test_the_agents_python_and_numpy_work_inside(bwrap: BwrapSandbox, host: Host) -> None:
    code = """
    import json, numpy, gpu_share.agent.sandbox
    print(json.dumps({"sum": int(numpy.arange(5).sum())}))
    """
    assert await run_json(bwrap, python_job(host.job_b, code)) == {"sum": 10}


async def test_exit_status_is_the_jobs_and_a_signal_is_negative(
    bwrap: BwrapSandbox, host: Host
) -> None:
    assert (await run(bwrap, python_job(host.job_b, "raise SystemExit(3)")))[0] == 3
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert (await run(bwrap, python_job(host.job_b, crash)))[0] == -11


async def test_set_id_bits_a_job_sets_are_cleared_when_it_ends(
    bwrap: BwrapSandbox, host: Host
) -> None:
    code = """
    import os, shutil
    shutil.copy("/usr/bin/id", "tool")
    os.chmod("tool", 0o6755)
    os.mkdir("shared")
    os.chmod("shared", 0o2777)
    print(oct(os.stat("tool").st_mode & 0o7777))
    """
    status, output = await run(bwrap, python_job(host.job_b, code))
    assert (status, output.strip()) == (0, "0o6755")  # it could, while it ran …
    assert stat.S_IMODE((host.job_b / "tool").stat().st_mode) == 0o755  # … and no more
    assert stat.S_IMODE((host.job_b / "shared").stat().st_mode) == 0o777


async def test_a_job_folder_other_users_can_reach_is_refused(
    bwrap: BwrapSandbox, host: Host
) -> None:
    (host.root / "jobs").chmod(0o755)
    with pytest.raises(SandboxError, match="chmod 700"):
        await bwrap.start(python_job(host.job_b, "pass"))


def test_auto_picks_bwrap_when_docker_is_absent(
    bwrap: BwrapSandbox, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` fails
    with caplog.at_level(logging.INFO):
        sandbox = detect_sandbox("auto")
    assert isinstance(sandbox, BwrapSandbox) and sandbox.isolated
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_explicit_bwrap_without_bwrap_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        detect_sandbox("bwrap")


# The argv alone: what would be mounted, without running anything.


def spec_for(job_dir: Path, **fields: Any) -> SandboxSpec:
    return SandboxSpec(
        argv=["python", "-m", "runtime", "spec.json"],
        job_dir=job_dir,
        inputs=fields.pop("inputs", {}),
        env={},
        **fields,
    )


def options(argv: list[str], flag: str, arity: int) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1 : i + 1 + arity]) for i, a in enumerate(argv) if a == flag]


def setenv(argv: list[str]) -> dict[str, str]:
    return {pair[0]: pair[1] for pair in options(argv, "--setenv", 2)}


def test_command_binds_the_job_folder_at_job_and_inputs_at_job_in(host: Host) -> None:
    argv = BwrapSandbox().command(spec_for(host.job_b, inputs={"model.onnx": host.blob}))
    assert argv[-5:] == ["--", "python", "-m", "runtime", "spec.json"]
    assert options(argv, "--bind", 2) == [(str(host.job_b), "/job")]
    assert (str(host.blob), "/job/in/model.onnx") in options(argv, "--ro-bind", 2)
    assert options(argv, "--chdir", 1) == [("/job",)]
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv


def test_command_never_binds_the_host_root_or_the_agent_data(host: Host) -> None:
    argv = BwrapSandbox().command(spec_for(host.job_b, inputs={"m": host.blob}))
    sources = {
        s for flag in ("--bind", "--ro-bind", "--ro-bind-try") for s, _ in options(argv, flag, 2)
    }
    assert "/" not in sources
    for private in (host.root, host.job_a, host.node_key.parent, host.blob.parent):
        assert str(private) not in sources
    allowed = {str(host.job_b), str(host.blob)}
    assert not [s for s in sources - allowed if Path(s).is_relative_to(host.root)]


def test_command_refuses_a_job_folder_inside_what_every_job_sees(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "jobs" / "a").mkdir(parents=True)
    sandbox = BwrapSandbox(runtime_paths=[venv])
    with pytest.raises(SandboxError, match="every sandboxed job can read"):
        sandbox.command(spec_for(venv / "jobs" / "a"))


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "", "."])
def test_command_refuses_input_names_that_are_not_plain(host: Host, name: str) -> None:
    with pytest.raises(SandboxError):
        BwrapSandbox().command(spec_for(host.job_b, inputs={name: host.blob}))


def test_command_binds_only_the_assigned_gpus_device_nodes(host: Host) -> None:
    sandbox = BwrapSandbox(gpu_minor_numbers={"GPU-aaa": 2, "GPU-bbb": 3})
    argv = sandbox.command(spec_for(host.job_b, gpu_uuids=["GPU-aaa"]))
    assert options(argv, "--dev-bind", 2) == [("/dev/nvidia2", "/dev/nvidia2")]
    assert ("/dev/nvidiactl", "/dev/nvidiactl") in options(argv, "--dev-bind-try", 2)
    assert ("/dev/nvidia-uvm", "/dev/nvidia-uvm") in options(argv, "--dev-bind-try", 2)
    assert ("/proc/driver/nvidia", "/proc/driver/nvidia") in options(argv, "--ro-bind-try", 2)
    env = setenv(argv)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa"


def test_command_for_two_of_four_gpus_binds_those_two_and_names_them_in_order(
    host: Host,
) -> None:
    minors = {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2, "GPU-d": 3}
    argv = BwrapSandbox(gpu_minor_numbers=minors).command(
        spec_for(host.job_b, gpu_uuids=["GPU-d", "GPU-b"])
    )
    assert options(argv, "--dev-bind", 2) == [
        ("/dev/nvidia3", "/dev/nvidia3"),
        ("/dev/nvidia1", "/dev/nvidia1"),
    ]
    assert {pair[0] for pair in options(argv, "--dev-bind-try", 2)} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    }
    # CUDA numbers the job's GPUs 0 and 1 in this order: GPU-d is its device 0.
    assert setenv(argv)["CUDA_VISIBLE_DEVICES"] == "GPU-d,GPU-b"


def test_command_refuses_a_gpu_this_machine_does_not_have(host: Host) -> None:
    sandbox = BwrapSandbox(gpu_minor_numbers={"GPU-aaa": 0})
    with pytest.raises(SandboxError, match="GPU-zzz"):
        sandbox.command(spec_for(host.job_b, gpu_uuids=["GPU-zzz"]))


def test_command_without_minor_numbers_only_names_the_gpus(host: Host) -> None:
    argv = BwrapSandbox().command(spec_for(host.job_b, gpu_uuids=["GPU-a", "GPU-b"]))
    assert options(argv, "--dev-bind", 2) == []
    assert setenv(argv)["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"


def test_command_for_a_cpu_job_exposes_no_nvidia_device(host: Host) -> None:
    argv = BwrapSandbox(gpu_minor_numbers={"GPU-aaa": 0}).command(spec_for(host.job_b))
    assert not [a for a in argv if a.startswith(("/dev/nvidia", "/proc/driver/nvidia"))]
    assert setenv(argv)["CUDA_VISIBLE_DEVICES"] == ""


def test_command_without_user_namespace_keeps_the_other_namespaces(host: Host) -> None:
    argv = BwrapSandbox(user_namespace=False).command(spec_for(host.job_b))
    assert "--unshare-all" in argv and "--uid" not in argv and "--unshare-user" not in argv


def test_command_leaves_out_what_an_older_bwrap_lacks(host: Host) -> None:
    old = {"--unshare-all", "--unshare-user", "--uid", "--gid", "--bind", "--ro-bind", "--tmpfs"}
    argv = BwrapSandbox(supported_options=old).command(spec_for(host.job_b))
    assert not {"--disable-userns", "--size", "--clearenv"} & set(argv)
    assert ("/tmp",) in options(argv, "--tmpfs", 1)
    modern = BwrapSandbox().command(spec_for(host.job_b))
    assert {"--disable-userns", "--size", "--clearenv"} <= set(modern)


def test_system_mounts_keep_usr_merge_symlinks(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "lib64").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    assert system_mounts(tmp_path) == [
        *("--ro-bind", str(tmp_path / "usr"), "/usr"),
        *("--symlink", "usr/bin", "/bin"),
        *("--ro-bind", str(tmp_path / "lib64"), "/lib64"),
    ]


def test_runtime_paths_hold_the_python_and_the_package_but_not_the_repository() -> None:
    paths = python_runtime_paths()
    package = Path(gpu_share.__file__).resolve()
    assert any(package.is_relative_to(p) for p in paths)
    assert any(Path(sys.prefix).is_relative_to(p) for p in paths)
    assert not any(Path(__file__).resolve().is_relative_to(p) for p in paths)  # tests/


def test_nvidia_minor_numbers_are_read_from_the_driver(tmp_path: Path) -> None:
    for bus, uuid, minor in [("0000:01:00.0", "GPU-aaa", 0), ("0000:41:00.0", "GPU-bbb", 3)]:
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {uuid}\n"
            f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    assert nvidia_minor_numbers(tmp_path) == {"GPU-aaa": 0, "GPU-bbb": 3}
    assert nvidia_minor_numbers(tmp_path / "absent") is None
