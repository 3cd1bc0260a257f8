"""Artifact bytes: where they live. The database says who owns what."""

from gpu_share.coordinator.storage.base import ArtifactStore, UploadSink
from gpu_share.coordinator.storage.local import LocalArtifactStore

__all__ = ["ArtifactStore", "LocalArtifactStore", "UploadSink"]
