"""What an upload must be for its kind, judged before anything is kept (SPEC §1.3).

A file uploaded under the wrong kind, or one that is not what its kind promises, used
to be accepted and to fail only when an invoke ran it, minutes later, on a provider's
node. It is refused at upload instead (422, nothing stored, no quota used), saying what
is wrong and what to send:

- `model`: an ONNX model (`onnx_signature`): protobuf that holds a graph importing an
  operator set, every input and output named, weights inside the file. Its inputs and
  outputs are recorded with the artifact, so they can be shown.
- `config`: a CatBoost train config, checked by the contract the runtime itself checks
  (`agent/runtimes/catboost_config`).
- `inputs`: an NPZ archive the runtimes can read (`npz_reading`, the one NPZ reader).
- `outputs` and `checkpoint` are written by the platform's agents, not uploaded here;
  a checkpoint is checked where it is stored (`work/checkpoint_formats`).

Every check reads the upload back from the temporary file it streamed into, in a worker
thread, and takes only what it needs, so checking costs no memory that grows with the
upload: a model's weights and nodes are stepped over with seeks; an NPZ's members stream
through the bounded reader and are dropped, and its data is verified (inflated, CRC)
only while its arrays expand to at most `NPZ_VERIFY_BYTES` (past that the directory and
headers are judged, and the runtime verifies the data as it reads it); a config is read
whole, so it may be at most `CONFIG_MAX_BYTES` (the upload's size limit for configs,
`artifacts.upload_limit`, so a larger one is a 413 before it is sent): parsed JSON takes
several times its text in memory, and a train config is parameters, a few KiB (even
100 000 feature names fit).

The bytes checked are the bytes stored, whether or not another upload already stored
the same content: a blob's existence says nothing of the kind it is uploaded as now.
"""

import json
from typing import BinaryIO

from gpu_share.agent.runtimes.catboost_config import parse_train_config
from gpu_share.agent.runtimes.runner import JobFailure
from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.services.artifacts.onnx_signature import NotOnnx, read_signature
from gpu_share.npz_reading import MiB, NpzError, check_npz, size_text
from gpu_share.protocol.artifacts import ArtifactKind, ModelSignature

CHECKED_KINDS = (ArtifactKind.MODEL, ArtifactKind.INPUTS, ArtifactKind.CONFIG)
CONFIG_MAX_BYTES = 4 * MiB
NPZ_VERIFY_BYTES = 1024 * MiB
HEAD_BYTES = 64

SEND_MODEL = "send the model as one .onnx file"
SEND_INPUTS = "write the inputs with numpy.savez(f, <input name>=array)"
SEND_CONFIG = (
    'send the CatBoost train config as a JSON object, e.g. {"task": "regression", '
    '"iterations": 500}'
)


def check(kind: ArtifactKind, file: BinaryIO, size: int) -> ModelSignature | None:
    """Raises `ValidationFailed` when the file is not what `kind` promises; a model's
    inputs and outputs otherwise (None for other kinds)."""
    if kind is ArtifactKind.MODEL:
        return _model(file, size)
    if kind is ArtifactKind.INPUTS:
        _inputs(file)
    elif kind is ArtifactKind.CONFIG:
        _config(file, size)
    return None


def _model(file: BinaryIO, size: int) -> ModelSignature:
    try:
        return read_signature(file, size)
    except NotOnnx as exc:
        other = _other_kind(file, ArtifactKind.MODEL)
        raise _refused(
            ArtifactKind.MODEL, f"the file is not an ONNX model: {other or exc}", SEND_MODEL
        ) from exc


def _inputs(file: BinaryIO) -> None:
    try:
        arrays = check_npz(file, verify_data_up_to=NPZ_VERIFY_BYTES)
    except NpzError as exc:
        other = _other_kind(file, ArtifactKind.INPUTS)
        why = f"the file is not an NPZ archive: {other}" if other else str(exc)
        raise _refused(ArtifactKind.INPUTS, why, SEND_INPUTS) from exc
    if not arrays:
        raise _refused(ArtifactKind.INPUTS, "the NPZ archive holds no arrays", SEND_INPUTS)


def _config(file: BinaryIO, size: int) -> None:
    if size > CONFIG_MAX_BYTES:
        raise _refused(
            ArtifactKind.CONFIG,
            f"a CatBoost train config may be at most {size_text(CONFIG_MAX_BYTES)} and this "
            f"file is {size_text(size)}; a config holds parameters, the data goes in the "
            "inputs NPZ (kind=inputs)",
            SEND_CONFIG,
        )
    other = _other_kind(file, ArtifactKind.CONFIG)
    if other is not None:
        raise _refused(
            ArtifactKind.CONFIG, f"the file is not a CatBoost train config: {other}", SEND_CONFIG
        )
    file.seek(0)
    try:
        parse_train_config(file.read())
    except JobFailure as exc:
        raise _refused(ArtifactKind.CONFIG, str(exc), None) from exc


def _other_kind(file: BinaryIO, kind: ArtifactKind) -> str | None:
    """What the file is instead, when it is recognizably something else: most wrong
    uploads are the right file under the wrong kind, or a file saved in another format."""
    file.seek(0)
    head = file.read(HEAD_BYTES)
    stripped = head.lstrip()
    if not head:
        return "it is empty"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) and kind is not ArtifactKind.INPUTS:
        pytorch = " or a PyTorch checkpoint (export it with torch.onnx.export)"
        return "it is a zip archive, such as an NPZ of inputs (upload those with kind=inputs)" + (
            pytorch if kind is ArtifactKind.MODEL else ""
        )
    if head.startswith(b"\x93NUMPY"):
        return "it is a single .npy array"
    if head.startswith(b"CBM1"):
        return (
            "it is a trained CatBoost model (.cbm): to run it, save it with "
            "model.save_model(path, format='onnx'); to train, upload a train config"
        )
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return (
            "it is a Python pickle (a scikit-learn or PyTorch object?), which is never "
            "loaded here; convert the model to ONNX (skl2onnx, torch.onnx.export)"
        )
    if stripped.startswith(b"{") and kind is not ArtifactKind.CONFIG:
        return "it is JSON, such as a CatBoost train config (upload those with kind=config)"
    if kind is not ArtifactKind.MODEL and head[:1] == b"\x08" and _is_onnx(file):
        return "it is an ONNX model (upload models with kind=model)"
    if kind is ArtifactKind.CONFIG:
        return _not_a_json_object(file)
    if _is_text(head):
        text = head.decode("utf-8", errors="ignore").strip()
        more = "…" if len(text) > 40 or len(head) == HEAD_BYTES else ""
        page = " (an HTML page saved instead of the file?)" if text[:1] == "<" else ""
        return f"it is text: {json.dumps(text[:40])}{more}{page}"
    return None


def _is_onnx(file: BinaryIO) -> bool:
    """Whether the file reads as an ONNX model (which starts with its ir_version, field 1)."""
    end = file.seek(0, 2)
    try:
        read_signature(file, end)
    except NotOnnx:
        return False
    return True


def _not_a_json_object(file: BinaryIO) -> str | None:
    file.seek(0)
    try:
        value = json.loads(file.read())
    except RecursionError:
        return None  # JSON nested past the parser: the config check names the limit
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"it is not JSON ({exc})"
    if not isinstance(value, dict):
        return f"it is a JSON {type(value).__name__}, not an object"
    return None


def _is_text(head: bytes) -> bool:
    text = head.decode("utf-8", errors="ignore")  # the last character may be cut
    return len(text.encode()) >= len(head) - 3 and all(c.isprintable() or c.isspace() for c in text)


def _refused(kind: ArtifactKind, why: str, instead: str | None) -> ValidationFailed:
    """A 422 saying what is wrong and what to send; `details` names the kind and the
    reason alone, for scripts."""
    why = why.rstrip(".")
    return ValidationFailed(
        why + (f"; {instead}" if instead else ""), details={"kind": kind.value, "reason": why}
    )
