"""The agent's installer as a provider meets it (SPEC §3.2): fetched from a live
coordinator (`gpu-share server`), run by bash into a prefix the test owns, the agent
started the way the script says, the node seen online; then a second run, which updates
in place, and `--uninstall`.

No package index is used. The prefix's virtual environment is made before the script
runs, with a .pth line that puts this test environment's site-packages behind its own,
and the script, which keeps a working venv it finds, installs the coordinator's wheel
into it with `--pip-args=--no-index`: every dependency is then already there. A provider's
first run makes the venv itself and lets pip fetch the dependencies from its index.
"""

import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_share.coordinator.api.public.install import WHEEL_NAME
from gpu_share.testing.servers import free_port
from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

SCRIPT_FILE = (
    Path(__file__).resolve().parents[2] / "src/gpu_share/coordinator/web/static/install.sh"
)
START_LINE = re.compile(r"^start the agent with: (\S+)$", re.MULTILINE)
AGENT_ENV = {"GPUSHARE_AGENT_LEASE_WAIT_SEC": "2", "GPUSHARE_AGENT_DRAIN_TIMEOUT_SEC": "1"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("install-stack"), agents=0) as live:
        yield live


@pytest.fixture(scope="module")
def script(stack: LiveStack) -> str:
    response = stack.http.get("/agent/install.sh")
    assert response.status_code == 200, response.text
    return response.text


NOBODY = 65534


def run_script(
    script: str, *args: str | Path, unprivileged: bool = False
) -> subprocess.CompletedProcess[str]:
    """`curl …/agent/install.sh | bash -s -- ARGS`, the script on standard input;
    `unprivileged`: as nobody when the test runs as root."""
    argv = ["bash", "-s", "--", *map(str, args)]
    if unprivileged and os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=600)


def shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("shellcheck") is None:
        pytest.fail("the script's lint needs Debian's shellcheck: apt-get install shellcheck")
    return subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, check=False)


def venv_with_this_environments_packages(prefix: Path) -> None:
    """What the script's pip would fetch, put in place beforehand (see the module doc)."""
    venv = prefix / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    purelib = Path(
        subprocess.check_output(
            [
                str(venv / "bin/python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            text=True,
        ).strip()
    )
    (purelib / "test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")


def install(script: str, prefix: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = run_script(script, "--prefix", prefix, "--no-service", "--pip-args=--no-index", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def start_agent(installed: subprocess.CompletedProcess[str], log: Path) -> subprocess.Popen[bytes]:
    """Start the agent with the command the script printed."""
    match = START_LINE.search(installed.stdout)
    assert match, installed.stdout
    with log.open("ab") as out:
        return subprocess.Popen(
            [match.group(1), "--log-level", "info"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **AGENT_ENV},
        )


def node_comes_online(
    stack: LiveStack,
    identity: Path,
    agent: subprocess.Popen[bytes],
    log: Path,
    **expected: object,
) -> str:
    """The node of the agent's identity, once it is online with the `expected` fields."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert agent.poll() is None, f"the agent exited:\n{log.read_text()[-3000:]}"
        if identity.is_file():
            node_id: str = json.loads(identity.read_text())["node_id"]
            node = {n["id"]: n for n in stack.http.get("/v1/nodes").json()}.get(node_id, {})
            wanted = {"status": "online", **expected}
            if all(node.get(key) == value for key, value in wanted.items()):
                return node_id
        time.sleep(0.1)
    raise AssertionError(f"the node never came online:\n{log.read_text()[-3000:]}")


def stop(agent: subprocess.Popen[bytes]) -> None:
    if agent.poll() is None:
        agent.terminate()
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(10)


def test_the_script_is_clean_for_shellcheck() -> None:
    result = shellcheck(SCRIPT_FILE)
    assert result.returncode == 0 and not result.stdout, result.stdout + result.stderr


def test_the_script_arrives_with_this_coordinators_url_and_wheel(
    stack: LiveStack, script: str, tmp_path: Path
) -> None:
    response = stack.http.get("/agent/install.sh")
    assert response.headers["content-type"].startswith("text/x-shellscript")
    assert f"SERVER_DEFAULT={stack.base_url}\n" in script
    assert f"WHEEL_NAME={WHEEL_NAME}\n" in script
    served = tmp_path / "install.sh"
    served.write_text(script)
    result = shellcheck(served)
    assert result.returncode == 0 and not result.stdout, result.stdout

    helped = run_script(script, "--help")
    assert helped.returncode == 0, helped.stderr
    assert stack.base_url in helped.stdout
    for option in ("--token", "--prefix", "--no-service", "--docker", "--uninstall"):
        assert option in helped.stdout


def test_the_served_wheel_is_the_running_package_with_its_extras(stack: LiveStack) -> None:
    response = stack.http.get(f"/agent/{WHEEL_NAME}")
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as wheel:
        names = set(wheel.namelist())
        assert {"gpu_share/__init__.py", "gpu_share/agent/worker.py"} <= names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        dist_info = WHEEL_NAME.split("-py3")[0] + ".dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        assert "Provides-Extra: agent" in metadata and "Provides-Extra: onnx" in metadata
        assert (
            "gpu-share = gpu_share.cli.main:main"
            in wheel.read(f"{dist_info}/entry_points.txt").decode()
        )
        for line in wheel.read(f"{dist_info}/RECORD").decode().splitlines():
            name, digest, size = line.rsplit(",", 2)
            if name.endswith("/RECORD"):
                continue
            data = wheel.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode() and int(size) == len(data), name
    assert stack.http.get(f"/agent/{WHEEL_NAME}").content == response.content


def test_installed_agent_comes_online_and_a_second_run_updates_in_place(
    stack: LiveStack, script: str, tmp_path: Path
) -> None:
    prefix = tmp_path / "gpu-share"
    venv_with_this_environments_packages(prefix)
    token = stack.enrollment_token()
    installed = install(script, prefix, "--token", token)
    assert "installed in" in installed.stdout, installed.stdout

    env_file = prefix / "agent.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    settings = env_file.read_text()
    assert f"GPUSHARE_AGENT_SERVER={stack.base_url}\n" in settings
    assert f"GPUSHARE_AGENT_TOKEN={token}\n" in settings
    assert f"GPUSHARE_AGENT_DATA_DIR={prefix / 'data'}\n" in settings
    launcher = START_LINE.search(installed.stdout)
    assert launcher and launcher.group(1) == str(prefix / "bin/gpu-share-agent")
    result = shellcheck(Path(launcher.group(1)))
    assert result.returncode == 0 and not result.stdout, result.stdout

    log = tmp_path / "agent.log"
    agent = start_agent(installed, log)
    try:
        node_id = node_comes_online(stack, prefix / "data/identity.json", agent, log)
    finally:
        stop(agent)

    # The owner's own setting survives; the token is kept without --token.
    with env_file.open("a") as f:
        f.write("GPUSHARE_AGENT_REGION=test-lab\n")
    again = install(script, prefix)
    assert "creating the virtual environment" not in again.stdout
    settings = env_file.read_text()
    assert f"GPUSHARE_AGENT_TOKEN={token}\n" in settings
    assert settings.count("GPUSHARE_AGENT_SERVER=") == 1
    assert "GPUSHARE_AGENT_REGION=test-lab\n" in settings

    agent = start_agent(again, log)
    try:
        # The same node (its identity kept), now in the region only agent.env names.
        identity = prefix / "data/identity.json"
        assert node_comes_online(stack, identity, agent, log, region="test-lab") == node_id
    finally:
        stop(agent)


def test_uninstall_stops_the_agent_and_leaves_nothing(
    stack: LiveStack, script: str, tmp_path: Path
) -> None:
    prefix = tmp_path / "gpu-share"
    venv_with_this_environments_packages(prefix)
    installed = install(script, prefix, "--token", stack.enrollment_token())
    log = tmp_path / "agent.log"
    agent = start_agent(installed, log)
    try:
        node_comes_online(stack, prefix / "data/identity.json", agent, log)
        removed = run_script(script, "--uninstall", "--prefix", prefix)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert "stopping the agent" in removed.stdout
        assert agent.wait(120) is not None
    finally:
        stop(agent)
    assert not prefix.exists()
    again = run_script(script, "--uninstall", "--prefix", prefix)
    assert again.returncode == 0, again.stderr


def test_uninstall_refuses_a_folder_it_did_not_make(script: str, tmp_path: Path) -> None:
    keep = tmp_path / "precious.txt"
    keep.write_text("not the agent's")
    result = run_script(script, "--uninstall", "--prefix", tmp_path)
    assert result.returncode == 1
    assert "not made by this script" in result.stderr
    assert keep.read_text() == "not the agent's"


def test_each_problem_is_one_line_and_nothing_is_installed(script: str, tmp_path: Path) -> None:
    prefix = tmp_path / "gpu-share"
    result = run_script(
        script,
        "--server",
        f"http://127.0.0.1:{free_port()}",
        "--python",
        tmp_path / "no-such-python",
        "--prefix",
        prefix,
        "--no-service",
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert all(line.startswith("install.sh: error: ") for line in lines), result.stderr
    assert len(lines) == 3, result.stderr
    assert "no enrollment token" in lines[0]
    assert "no Python 3.11 or newer" in lines[1]
    assert "cannot reach the coordinator" in lines[2]
    assert not prefix.exists()


def test_root_is_needed_for_a_system_prefix_only(script: str) -> None:
    system = run_script(
        script, "--token", "gpu_et_x", "--prefix", "/opt/gpu-share-test", unprivileged=True
    )
    assert system.returncode == 1
    assert "installing into /opt/gpu-share-test needs root" in system.stderr

    own = Path(tempfile.mkdtemp(prefix="gpu-share-install-"))
    try:
        if os.geteuid() == 0:
            os.chown(own, NOBODY, NOBODY)
        result = run_script(
            script,
            "--token",
            "gpu_et_x",
            "--prefix",
            own / "agent",
            "--no-service",
            "--python",
            "/nonexistent/python3",
            unprivileged=True,
        )
        assert result.returncode == 1
        assert "needs root" not in result.stderr
        assert result.stderr.splitlines() == [
            "install.sh: error: no Python 3.11 or newer found: install one (e.g. apt-get "
            "install python3.11 python3.11-venv) or pass --python PATH"
        ]
    finally:
        shutil.rmtree(own)


def test_docker_mode_refuses_without_an_engine_with_the_nvidia_runtime(
    script: str, tmp_path: Path
) -> None:
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    ):
        pytest.skip("a Docker engine runs here: the refusal needs a machine without one")
    result = run_script(script, "--docker", "--token", "gpu_et_x", "--prefix", tmp_path / "p")
    assert result.returncode == 1
    assert "install.sh: error: --docker needs " in result.stderr
    assert not (tmp_path / "p").exists()
