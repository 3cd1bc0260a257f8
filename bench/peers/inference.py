"""What every peer does with a request: NPZ in, the ONNX model run, NPZ out.

The session options are the ones our ONNX runtime uses (the same intra-op thread count,
idle threads sleeping instead of spinning), so that the sides differ in how a request
reaches the model, not in how the model runs.
"""

import io
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort


def open_session(model: Path | str, threads: int) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def run_npz(session: Any, body: bytes) -> bytes:
    """Feed the NPZ's arrays by name, answer the outputs by name as an NPZ."""
    with np.load(io.BytesIO(body), allow_pickle=False) as inputs:
        feeds = {name: inputs[name] for name in inputs.files}
    values = session.run(None, feeds)
    buffer = io.BytesIO()
    outputs: dict[str, Any] = {
        o.name: v for o, v in zip(session.get_outputs(), values, strict=True)
    }
    np.savez(buffer, **outputs)
    return buffer.getvalue()


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode_npz(body: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(body), allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}
