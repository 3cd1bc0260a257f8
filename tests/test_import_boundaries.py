"""DESIGN.md boundaries: the SDK installs light, and the agent never imports the coordinator."""

import json
import subprocess
import sys

import pytest

HEAVY = ["fastapi", "sqlalchemy", "onnxruntime", "catboost", "starlette", "uvicorn"]


def modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in json.loads(out.stdout)}


@pytest.mark.parametrize("statement", ["import gpu_share", "import gpu_share.sdk"])
def test_sdk_import_pulls_in_no_server_or_runtime(statement: str) -> None:
    loaded = modules_loaded_by(statement)
    assert not loaded & set(HEAVY), f"{statement} loaded {sorted(loaded & set(HEAVY))}"


def test_cli_entry_point_imports_no_server() -> None:
    loaded = modules_loaded_by("import gpu_share.cli.main")
    assert not loaded & set(HEAVY)
