"""The container files, checked without a Docker engine (CI has none, so the images are
never built here): compose.yaml parses and names what exists, the Dockerfiles copy only
files of this repository that .dockerignore lets into the build context, pin their base
images and run as the user install.sh --docker expects."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "deploy").glob("*.Dockerfile"))
INSTALL_SH = ROOT / "src/gpu_share/coordinator/web/static/install.sh"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text())
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(
        rest.split("=", 1)
        for keyword, rest in instructions(dockerfile)
        if keyword == "ARG" and "=" in rest
    )


def _pattern(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*|\?)", pattern.rstrip("/"))
    wildcards = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcards.get(p, re.escape(p)) for p in parts) + r"\Z")


def in_build_context(path: str) -> bool:
    """Whether .dockerignore lets `path` in: the last pattern matching it, or a folder
    above it, decides."""
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = _pattern(rule.removeprefix("!"))
        if any(pattern.match(prefix) for prefix in prefixes):
            included = negated
    return included


def test_there_are_both_dockerfiles() -> None:
    assert [d.name for d in DOCKERFILES] == ["agent.Dockerfile", "coordinator.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda d: d.name)
def test_dockerfile_copies_repository_files_that_reach_the_build_context(
    dockerfile: Path,
) -> None:
    copies = [rest for keyword, rest in instructions(dockerfile) if keyword == "COPY"]
    sources = [
        source
        for rest in copies
        if "--from=" not in rest
        for source in rest.split()[:-1]
        if not source.startswith("--")
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is not here"
        assert in_build_context(source), f".dockerignore keeps {source} out of the build"
    assert in_build_context("src/gpu_share/coordinator/web/static/install.sh")
    for private in (
        ".venv/bin/python",
        ".git/config",
        ".gpushare/gpushare.db",
        "tests/conftest.py",
    ):
        assert not in_build_context(private), private
    assert not in_build_context("src/gpu_share/__pycache__/x.cpython-311.pyc")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda d: d.name)
def test_dockerfile_pins_its_base_images_and_runs_as_a_user(dockerfile: Path) -> None:
    defaults = arg_defaults(dockerfile)
    stages = set()
    for keyword, rest in instructions(dockerfile):
        if keyword != "FROM":
            continue
        image, *alias = rest.split()
        if alias:
            stages.add(alias[-1])
        if image in stages:
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)
        name, _, tag = image.partition(":")
        assert re.search(r"\d", tag) and "latest" not in tag, f"{name} is not pinned: {image}"
    users = [rest for keyword, rest in instructions(dockerfile) if keyword == "USER"]
    assert users and not users[-1].startswith(("0", "root")), users


def test_agent_image_runs_as_the_uid_install_sh_hands_the_data_folder_to() -> None:
    agent = ROOT / "deploy/agent.Dockerfile"
    uid = re.search(r"^AGENT_UID=(\d+)", INSTALL_SH.read_text(), re.MULTILINE)
    assert uid
    assert ("USER", f"{uid.group(1)}:{uid.group(1)}") in instructions(agent)
    # The Docker sandbox runs each job in this image with its own command line.
    assert "ENTRYPOINT" not in {keyword for keyword, _ in instructions(agent)}


def test_compose_file_runs_the_coordinator_on_postgres() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "coordinator"}
    coordinator = services["coordinator"]
    assert (ROOT / coordinator["build"]["context"] / coordinator["build"]["dockerfile"]).is_file()
    assert coordinator["environment"]["GPUSHARE_DATABASE_URL"].startswith("postgresql+asyncpg://")
    assert coordinator["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) >= {"postgres", "artifacts"}
    image, _, tag = services["postgres"]["image"].partition(":")
    assert re.search(r"\d", tag), f"{image} is not pinned"


def test_the_commented_agent_service_is_valid_once_uncommented() -> None:
    text = (ROOT / "compose.yaml").read_text()
    block = re.search(r"^  # agent:\n(?:  #.*\n)+", text, re.MULTILINE)
    assert block
    uncommented = re.sub(r"^  # ?", "  ", block.group(0), flags=re.MULTILINE)
    agent = yaml.safe_load("services:\n" + uncommented)["services"]["agent"]
    assert (ROOT / agent["build"]["context"] / agent["build"]["dockerfile"]).is_file()
    assert agent["environment"]["GPUSHARE_AGENT_SANDBOX"] == "docker"
    assert "/var/run/docker.sock:/var/run/docker.sock" in agent["volumes"]
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


HADOLINT = shutil.which(
    "hadolint", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (the dev extra has it)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda d: d.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    assert HADOLINT is not None
    result = subprocess.run([HADOLINT, str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
