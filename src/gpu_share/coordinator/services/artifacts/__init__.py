"""Hosted artifacts (SPEC §1.3): streamed uploads with hashing and quota, each checked for
what its kind promises (`upload_checks`, `onnx_signature`), content-addressed blobs,
signed download links, expiry. Owns `artifacts`, `blobs`."""

__all__ = ["artifacts"]
