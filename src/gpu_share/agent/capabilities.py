"""Which runtimes this node may honestly advertise (SPEC §1.2: never a `*_cuda` runtime
without a working CUDA device).

A CUDA runtime is claimed only after a probe in a child process actually ran on the
GPU: a library that lists the CUDA provider but cannot load it does not count.
"""

import importlib.util
import logging
import subprocess
import sys

from gpu_share.agent.gpu import Gpu
from gpu_share.protocol.runtimes import RuntimeName

log = logging.getLogger(__name__)

# y = x + x on float32[1], opset 13: small enough to embed, needs no `onnx` package.
_PROBE_MODEL_B64 = (
    "CAg6OQoOCgF4CgF4EgF5IgNBZGQSBXByb2JlWg8KAXgSCgoICAESBAoCCAFiDwoBeRIKCggIARIECgIIAUIECgAQDQ=="
)

_ONNX_CUDA_PROBE = f"""
import base64, numpy as np, onnxruntime as ort
assert "CUDAExecutionProvider" in ort.get_available_providers(), "no CUDA provider in this build"
session = ort.InferenceSession(base64.b64decode("{_PROBE_MODEL_B64}"),
                               providers=["CUDAExecutionProvider"])
assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
(y,) = session.run(None, {{"x": np.array([2.0], dtype=np.float32)}})
assert float(y[0]) == 4.0
"""

_CATBOOST_CUDA_PROBE = """
from catboost.utils import get_gpu_device_count
assert get_gpu_device_count() > 0, "CatBoost sees no CUDA device"
"""


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def probe(code: str, name: str, timeout: float = 120.0) -> bool:
    """Run `code` in a child Python; True if it exits 0 (a crash cannot hurt the agent)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        log.warning("%s probe timed out; not advertising it", name)
        return False
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log.info("%s not available: %s", name, reason)
        return False
    return True


def detect_runtimes(gpus: list[Gpu]) -> list[RuntimeName]:
    runtimes: list[RuntimeName] = []
    if installed("onnxruntime"):
        runtimes.append(RuntimeName.ONNX_CPU)
        if gpus and probe(_ONNX_CUDA_PROBE, "onnx_cuda"):
            runtimes.append(RuntimeName.ONNX_CUDA)
    if installed("catboost") and _catboost_runtime_present():
        runtimes.append(RuntimeName.CATBOOST_CPU)
        if gpus and probe(_CATBOOST_CUDA_PROBE, "catboost_cuda"):
            runtimes.append(RuntimeName.CATBOOST_CUDA)
    return runtimes


def _catboost_runtime_present() -> bool:
    return installed("gpu_share.agent.runtimes.catboost")
