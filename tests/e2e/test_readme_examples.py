"""Every example in README.md runs, as written, against a real server process and a
real agent process: curl and the CLI in bash, the SDK in Python.

What changes on the way: the base URL (`http://127.0.0.1:8080`) and the keys
(`gpu_sk_…`, `gpu_admin_…`) become the test platform's; `sleep 5` in a polling loop
becomes `sleep 0.2` and `GPU_SHARE_POLL_INTERVAL=0.2` shortens the SDK's polling the
same way; `pip install` lines are skipped (the package is installed). Examples run in
order in one working directory, so a later one may use a file an earlier one made.
An example expects exit status 0 unless an HTML comment right above it says
otherwise, and must print what it names there:
`<!-- readme-test: exit=1 output="NO_CAPACITY" -->` (quote with '…' or "…").
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
RUNNABLE = ("bash", "python")

# Sections whose examples are not run here, and why.
NOT_RUN = {
    "Quick start": "`make up` and `make test` install and test the repository itself; "
    "tests/cli/test_up.py runs `gpu-share up` the way a newcomer does",
    "Providers: running the agent": "it installs and enrolls a provider machine; every "
    "end-to-end test starts `gpu-share agent` (testing.processes.AgentProcess)",
}

FENCE = re.compile(r"^```(\w*)\s*$")
EXPECT = re.compile(r"<!--\s*readme-test:(.*?)-->")


@dataclass(frozen=True)
class Example:
    section: str
    line: int
    lang: str
    code: str
    exit: int = 0
    output: str | None = None

    @property
    def id(self) -> str:
        return f"{self.lang}@{self.line}"


def read_examples() -> list[Example]:
    examples = []
    section = ""
    lines = README.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            section = line[3:].strip()
        match = FENCE.match(line)
        if not match:
            index += 1
            continue
        start = index
        index += 1
        while not lines[index].startswith("```"):
            index += 1
        expect = EXPECT.search(lines[start - 1]) if start else None
        options = (
            dict(re.findall(r"(\w+)=('[^']*'|\"[^\"]*\"|\S+)", expect.group(1))) if expect else {}
        )
        examples.append(
            Example(
                section=section,
                line=start + 1,
                lang=match.group(1),
                code="\n".join(lines[start + 1 : index]) + "\n",
                exit=int(options.get("exit", "0")),
                output=options["output"][1:-1] if "output" in options else None,
            )
        )
        index += 1
    return examples


EXAMPLES = read_examples()
TO_RUN = [e for e in EXAMPLES if e.lang in RUNNABLE and e.section not in NOT_RUN]


def test_every_example_runs_here_or_is_covered_elsewhere() -> None:
    """A block in another language would silently escape the test: only output may."""
    assert {e.lang for e in EXAMPLES} <= {*RUNNABLE, "text"}, "label examples bash or python"
    assert all(any(e.section == s for e in EXAMPLES) for s in NOT_RUN), "stale NOT_RUN"
    assert len(TO_RUN) >= 10


def localize(code: str, stack: LiveStack, tenant_key: str) -> str:
    code = code.replace("http://127.0.0.1:8080", stack.base_url)
    code = code.replace("gpu_sk_…", tenant_key).replace("gpu_admin_…", stack.admin_key)
    code = re.sub(r"\bsleep 5\b", "sleep 0.2", code)
    return re.sub(r"(?m)^pip install .*$", ": installed already", code)


def run(example: Example, stack: LiveStack, tenant_key: str, workdir: Path) -> str | None:
    """What went wrong with `example`, or None when it did as the README says."""
    code = localize(example.code, stack, tenant_key)
    argv = ["bash", "-eo", "pipefail", "-c", code]
    if example.lang == "python":
        argv = [sys.executable, "-c", code]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPU_SHARE_BASE_URL": stack.base_url,
        "GPU_SHARE_API_KEY": tenant_key,
        "GPU_SHARE_POLL_INTERVAL": "0.2",
    }
    done = subprocess.run(
        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    if done.returncode == example.exit and (example.output is None or example.output in output):
        return None
    expected = f"exit {example.exit}" + (f" and {example.output!r}" if example.output else "")
    return f"exited {done.returncode}, expected {expected}:\n{output}\n{stack.logs}"


def test_the_readme_examples_run_in_order_as_written(tmp_path: Path) -> None:
    """One test, not one per example: they share a working directory and a later one may
    use what an earlier one made, so they must run in order in one process (pytest-xdist
    may hand tests of one module to different workers). It stops at the first example
    that fails: the ones after it may need what it should have made."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    with LiveStack(tmp_path / "stack") as stack:
        tenant_key = stack.tenant_key("README Reader")
        for example in TO_RUN:
            wrong = run(example, stack, tenant_key, workdir)
            assert wrong is None, f"README line {example.line} ({example.lang}) {wrong}"
