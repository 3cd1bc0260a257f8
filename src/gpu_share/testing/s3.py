"""A real S3 HTTP endpoint on loopback for tests: moto in server mode, as a child process.

It speaks S3's REST protocol (SigV4, multipart uploads, CopyObject, presigned URLs),
so the S3 store is tested over the same wire it uses against AWS or MinIO.
"""

import os
import secrets
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.servers import free_port

# moto takes any credentials; the S3 store reads them the AWS way, from the environment.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "gpu-share-test",
    "AWS_SECRET_ACCESS_KEY": "gpu-share-test-secret",
    "AWS_REGION": "us-east-1",
}


class S3Endpoint:
    def __init__(self, process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path

    @classmethod
    def start(cls, log_dir: Path, timeout: float = 60.0) -> "S3Endpoint":
        log_path = log_dir / "moto.log"
        for _attempt in range(3):  # another process may take the port in between
            port = free_port()
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **CREDENTIALS},
                )
            endpoint = cls(process, f"http://127.0.0.1:{port}", log_path)
            if endpoint._wait_ready(timeout):
                return endpoint
            endpoint.stop()
        raise RuntimeError(f"moto did not start; see {log_path}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                httpx.get(f"{self.url}/moto-api/", timeout=2)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            return True
        return False

    def use_for(self, settings: Settings) -> Settings:
        """`settings` storing artifacts in a new bucket of this endpoint."""
        settings.storage = "s3"
        settings.s3_bucket = self.create_bucket()
        settings.s3_endpoint_url = self.url
        return settings

    def create_bucket(self) -> str:
        name = f"gpu-share-{secrets.token_hex(6)}"
        httpx.put(f"{self.url}/{name}", timeout=10).raise_for_status()
        return name

    def multipart_uploads(self, bucket: str) -> list[str]:
        """The keys of the bucket's multipart uploads still in parts (begun, neither
        completed nor aborted)."""
        response = httpx.get(f"{self.url}/{bucket}", params={"uploads": ""}, timeout=10)
        response.raise_for_status()
        return [
            element.text or ""
            for element in ET.fromstring(response.text).iter()  # noqa: S314 (our own endpoint)
            if element.tag.endswith("}Key")
        ]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
