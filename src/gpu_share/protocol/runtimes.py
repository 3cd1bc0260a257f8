"""The runtimes a job can ask for (SPEC §1.2, §1.6)."""

from enum import StrEnum

from gpu_share.protocol.artifacts import ArtifactKind


class RuntimeName(StrEnum):
    ONNX_CUDA = "onnx_cuda"
    ONNX_CPU = "onnx_cpu"
    CATBOOST_CUDA = "catboost_cuda"
    CATBOOST_CPU = "catboost_cpu"

    @property
    def kind(self) -> str:
        return "train" if self.value.startswith("catboost") else "inference"

    @property
    def model_kind(self) -> ArtifactKind:
        """What `model_url` points to: an ONNX model, or a CatBoost training's train config."""
        return ArtifactKind.CONFIG if self.kind == "train" else ArtifactKind.MODEL

    @property
    def device(self) -> str:
        return "cuda" if self.value.endswith("_cuda") else "cpu"

    @property
    def needs_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def min_cuda(self) -> tuple[int, int] | None:
        """The CUDA version a node's driver must support to run this runtime."""
        return _MIN_CUDA.get(self)


# onnxruntime-gpu 1.18+ is built for CUDA 12; CatBoost's GPU training runs on CUDA 11 and up.
_MIN_CUDA = {RuntimeName.ONNX_CUDA: (12, 0), RuntimeName.CATBOOST_CUDA: (11, 0)}
