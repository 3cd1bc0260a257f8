"""What a running coordinator holds: settings, database, store, clock, notifier, signer.

Built once by the app's lifespan; routers reach it through `api.deps.RuntimeDep`,
background loops and services get it passed in. No web framework here.
"""

from dataclasses import dataclass

from gpu_share.coordinator.clock import Clock
from gpu_share.coordinator.db import Database
from gpu_share.coordinator.notify import Notifier
from gpu_share.coordinator.principals import PrincipalCache
from gpu_share.coordinator.services.signing import UrlSigner
from gpu_share.coordinator.session_hub import SessionHub
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
    sessions: SessionHub
    principals: PrincipalCache
