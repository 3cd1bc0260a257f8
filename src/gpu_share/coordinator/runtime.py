"""What a running coordinator holds: settings, database, store, clock, notifier, signer.

Built once by the app's lifespan and reached from routers through `get_runtime`.
"""

from dataclasses import dataclass

from fastapi import Request

from gpu_share.coordinator.clock import Clock
from gpu_share.coordinator.db import Database
from gpu_share.coordinator.notify import Notifier
from gpu_share.coordinator.services.signing import UrlSigner
from gpu_share.coordinator.settings import Settings
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.netguard import SafeFetcher


@dataclass
class Runtime:
    settings: Settings
    db: Database
    store: ArtifactStore
    clock: Clock
    notifier: Notifier
    signer: UrlSigner
    fetcher: SafeFetcher

    def base_url(self, request: Request) -> str:
        """The public URL to put into links: configured, else what this request came in on."""
        return self.settings.public_base_url or str(request.base_url).rstrip("/")


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime
