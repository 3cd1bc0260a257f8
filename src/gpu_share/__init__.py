"""GPU Share: ONNX inference and CatBoost training on remote GPUs."""

from gpu_share._version import __version__

__all__ = ["__version__"]
