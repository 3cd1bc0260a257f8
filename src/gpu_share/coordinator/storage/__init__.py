"""Artifact bytes: where they live. The database says who owns what."""

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.storage.base import ArtifactStore, UploadSink
from gpu_share.coordinator.storage.local import LocalArtifactStore

__all__ = ["ArtifactStore", "LocalArtifactStore", "UploadSink", "open_store"]


def open_store(settings: Settings) -> ArtifactStore:
    """The store the settings name; for a bucket, checked to answer (raises saying why)."""
    if settings.storage == "local":
        return LocalArtifactStore(settings.artifacts_path)
    from gpu_share.coordinator.storage.s3 import S3ArtifactStore  # obstore only when used

    store = S3ArtifactStore.open(
        settings.s3_bucket,
        endpoint_url=settings.s3_endpoint_url,
        public_endpoint_url=settings.s3_public_endpoint_url,
        region=settings.s3_region,
    )
    store.check()
    return store
