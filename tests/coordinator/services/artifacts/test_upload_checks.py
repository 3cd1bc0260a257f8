"""Uploads are checked for what their kind promises (issue 24 §2), on both databases: a
file that is not a model, inputs or config is refused with 422 at upload, saying what is
wrong and what to send, and leaves nothing behind."""

import hashlib
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import ArtifactRow, BlobRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.artifacts import upload_checks
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model

DIGITS = DIGITS_MODEL.read_bytes()
NPZ = DIGITS_INPUTS.read_bytes()
CONFIG = json.dumps({"task": "regression", "iterations": 50, "depth": 4}).encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def npz(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def edited_model(edit: str) -> bytes:
    model = onnx.load_from_string(identity_model())
    if edit == "no opset":
        del model.opset_import[:]
    elif edit == "no outputs":
        del model.graph.output[:]
    return bytes(model.SerializeToString())


def external_data_model(tmp: Path) -> bytes:
    """A model whose weight lives in a file beside it, as big models are saved."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])],
        "external",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(np.ones(4, dtype=np.float32), "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    path = tmp / "external.onnx"
    onnx.save_model(model, path, save_as_external_data=True, size_threshold=0)
    return path.read_bytes()


def corrupt_npz() -> bytes:
    """An NPZ whose array data was damaged in transit: its CRC no longer matches."""
    data = bytearray(npz(x=np.arange(1000, dtype=np.int64)))
    data[500] ^= 0xFF
    return bytes(data)


def stored_files(settings: Settings) -> list[Path]:
    return sorted(p for p in settings.artifacts_path.rglob("*") if p.is_file())


async def upload(
    client: httpx.AsyncClient, tenant: TenantHandle, data: bytes, kind: str
) -> httpx.Response:
    return await client.post(
        "/v1/artifacts",
        params={"kind": kind, "content_sha256": sha(data)},
        content=data,
        headers=tenant.headers,
    )


async def rows(app: FastAPI) -> tuple[int, int]:
    """(artifacts, blobs) in the database."""
    async with app.state.replica.db.read() as session:
        artifacts = await session.scalar(select(func.count()).select_from(ArtifactRow))
        blobs = await session.scalar(select(func.count()).select_from(BlobRow))
    return int(artifacts or 0), int(blobs or 0)


async def test_a_model_upload_records_its_inputs_and_outputs(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await upload(client, tenant, DIGITS, "model")
    assert response.status_code == 201, response.text
    signature = response.json()["signature"]
    assert signature == {
        "inputs": [{"name": "input", "type": "float32", "shape": [None, 64]}],
        "outputs": [
            {"name": "label", "type": "int64", "shape": [None]},
            {"name": "probabilities", "type": "float32", "shape": [None, 10]},
        ],
        "truncated": False,
    }
    artifact_id = response.json()["id"]
    got = await client.get(f"/v1/artifacts/{artifact_id}", headers=tenant.headers)
    assert got.json()["signature"] == signature
    listed = await client.get("/v1/artifacts", params={"kind": "model"}, headers=tenant.headers)
    assert listed.json()["items"][0]["signature"] == signature
    named = await upload(client, tenant, identity_model("pixels", ("batch", 3)), "model")
    assert named.json()["signature"]["inputs"] == [
        {"name": "pixels", "type": "float32", "shape": ["batch", 3]}
    ]


async def test_inputs_and_configs_that_are_what_they_promise_are_kept_without_a_signature(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    for data, kind in ((NPZ, "inputs"), (CONFIG, "config")):
        response = await upload(client, tenant, data, kind)
        assert response.status_code == 201, response.text
        assert response.json()["signature"] is None


REFUSED = [
    ("model", b"<html>not a model</html>", 'not an ONNX model: it is text: "<html>'),
    ("model", b"not an onnx model", "not an ONNX model: it is text"),
    (
        "model",
        CONFIG,
        "it is JSON, such as a CatBoost train config (upload those with kind=config)",
    ),
    ("model", NPZ, "it is a zip archive, such as an NPZ of inputs (upload those with kind=inputs)"),
    ("model", DIGITS[:2000], "cut short"),
    ("model", edited_model("no opset"), "imports no operator set"),
    ("model", edited_model("no outputs"), "its graph declares no outputs"),
    ("model", b"\x80\x04\x95", "Python pickle"),
    ("model", b"CBM1\x00\x00", "trained CatBoost model (.cbm)"),
    ("inputs", DIGITS, "it is an ONNX model (upload models with kind=model)"),
    ("inputs", CONFIG, "it is JSON, such as a CatBoost train config"),
    ("inputs", b"\x93NUMPY\x01\x00", "it is a single .npy array"),
    ("inputs", b"a,b\n1,2\n", 'it is text: "a,b'),
    ("inputs", corrupt_npz(), "fails its CRC check"),
    ("inputs", npz(), "the NPZ archive holds no arrays"),
    ("inputs", npz(x=np.array([{"a": 1}], dtype=object)), "holds Python objects"),
    ("config", NPZ, "it is a zip archive, such as an NPZ of inputs"),
    ("config", DIGITS, "it is an ONNX model (upload models with kind=model)"),
    ("config", b"iterations: 500\n", "it is not JSON"),
    ("config", b"[1, 2]", "it is a JSON list, not an object"),
    ("config", b'{"task": "regression", "iteratons": 5}', "did you mean iterations?"),
    ("config", b'{"iterations": 5}', 'which task: "classification", "regression" or "ranking"'),
    ("config", b'{"task": "regression", "task_type": "GPU"}', "task_type cannot be set"),
]
WHAT_TO_SEND = {
    "model": "send the model as one .onnx file",
    "inputs": "write the inputs with numpy.savez(f, <input name>=array)",
    "config": "",  # the runtime's contract names the key to change
}


@pytest.mark.parametrize(
    ("kind", "data", "why"), REFUSED, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(REFUSED)]
)
async def test_a_file_that_is_not_what_its_kind_promises_is_422_with_the_reason(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    settings: Settings,
    kind: str,
    data: bytes,
    why: str,
) -> None:
    response = await upload(client, tenant, data, kind)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert why in error["message"]
    assert WHAT_TO_SEND[kind] in error["message"]
    assert error["details"]["kind"] == kind and why in error["details"]["reason"]
    assert stored_files(settings) == []


async def test_a_model_that_keeps_its_weights_in_another_file_is_refused(
    client: httpx.AsyncClient, tenant: TenantHandle, tmp_path: Path
) -> None:
    response = await upload(client, tenant, external_data_model(tmp_path), "model")
    assert response.status_code == 422
    assert "its weight 'w' is stored outside the file" in response.json()["error"]["message"]
    assert "save_as_external_data=False" in response.json()["error"]["message"]


async def test_a_refused_upload_leaves_no_row_no_blob_and_no_quota_used(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    junk = b"<html>" + b"x" * (len(DIGITS) - 6)
    settings.tenant_quota_bytes = len(DIGITS)  # room for one file of this size
    assert (await upload(client, tenant, junk, "model")).status_code == 422
    assert stored_files(settings) == []  # no object, no temporary file
    assert await rows(app) == (0, 0)
    everything = await client.get(
        "/v1/artifacts", params={"include_expired": "true"}, headers=tenant.headers
    )
    assert everything.json()["items"] == []
    assert (await upload(client, tenant, DIGITS, "model")).status_code == 201  # quota intact


async def test_bytes_already_stored_are_checked_again_for_the_kind_they_come_as(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    settings: Settings,
    clock: FrozenClock,
) -> None:
    """The blob these bytes are stored in is no verdict on them: the same NPZ is valid
    inputs and no model or config, and bytes kept before uploads were checked (a model
    that is text) are refused when they come again."""
    mine = await upload(client, tenant, NPZ, "inputs")
    assert mine.status_code == 201
    for kind in ("model", "config"):
        refused = await upload(client, other_tenant, NPZ, kind)
        assert refused.status_code == 422, refused.text
    assert await rows(app) == (1, 1)
    download = await client.get(mine.json()["url"], headers=tenant.headers)
    assert download.content == NPZ

    legacy = b"a model, as uploads were once accepted"
    async with app.state.replica.db.write() as session:
        blob = BlobRow(
            id="blob_legacy", sha256=sha(legacy), size=len(legacy), storage_key="legacy",
            created_at=clock.now(),
        )  # fmt: skip
        session.add(blob)
        await session.flush()
        session.add(
            ArtifactRow(
                id="art_legacy", tenant_id=tenant.id, kind="model", size=len(legacy),
                sha256=sha(legacy), blob_id=blob.id, created_at=clock.now(),
                expires_at=clock.now() + timedelta(seconds=settings.artifact_ttl_sec),
            )
        )  # fmt: skip
    again = await upload(client, other_tenant, legacy, "model")
    assert again.status_code == 422
    assert "not an ONNX model" in again.json()["error"]["message"]
    assert await rows(app) == (2, 2)


async def test_a_config_over_the_size_a_train_config_has_is_413_before_it_is_read(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    """A config is read whole to be checked, so its limit is what a train config needs
    (4 MiB), below the configured one (64 MiB)."""
    assert settings.max_config_bytes > upload_checks.CONFIG_MAX_BYTES
    padded = b'{"task": "regression"' + b" " * upload_checks.CONFIG_MAX_BYTES + b"}"
    response = await upload(client, tenant, padded, "config")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["details"] == {"limit_bytes": upload_checks.CONFIG_MAX_BYTES, "kind": "config"}
    assert "the data goes in the inputs NPZ (kind=inputs)" in error["message"]
    assert stored_files(settings) == []


async def test_npz_data_past_the_verify_limit_is_judged_by_its_headers(
    client: httpx.AsyncClient, tenant: TenantHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inflating every array of a large archive at upload would cost what the agent's
    reading it costs; past the limit the directory and headers are judged, and the
    runtime verifies the data as it reads it."""
    damaged = corrupt_npz()  # 8000 bytes of int64 data
    monkeypatch.setattr(upload_checks, "NPZ_VERIFY_BYTES", 8000)
    assert (await upload(client, tenant, damaged, "inputs")).status_code == 422
    monkeypatch.setattr(upload_checks, "NPZ_VERIFY_BYTES", 7999)
    assert (await upload(client, tenant, damaged, "inputs")).status_code == 201
