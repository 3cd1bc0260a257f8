"""`Replica`: what one running coordinator process holds, built once by the app's lifespan.

Routers reach it through `api.deps.ReplicaDep` and background loops get it passed
in; services never see it whole, they take the parts they use.
"""

import asyncio
from dataclasses import dataclass, field

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.replica.key_cache import KeyCache
from gpu_share.coordinator.replica.notify import Notifier
from gpu_share.coordinator.replica.peers import Peers
from gpu_share.coordinator.replica.session_hub import SessionHub
from gpu_share.coordinator.replica.session_routes import SessionRoutes
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.netguard import SafeFetcher


@dataclass
class Replica:
    settings: Settings
    db: Database
    store: ArtifactStore
    clock: Clock
    notifier: Notifier  # wakes long-polls here and on the other replicas
    signer: UrlSigner
    fetcher: SafeFetcher
    hub: SessionHub  # the live sessions whose nodes are connected to this replica
    key_cache: KeyCache
    id: str = field(default_factory=lambda: new_id("rep"))
    peers: Peers | None = None  # the hop to the other processes' hubs, when they relay
    routes: SessionRoutes | None = None  # where they hold the sessions relayed to
    # At most `settings.claims_at_once` claims in flight here: the rest wait in memory,
    # holding no database connection, so heartbeats and results still get one when agents
    # pile in.
    claim_gate: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.claim_gate = asyncio.Semaphore(self.settings.claims_at_once)

    relay_url: str | None = None  # where the other processes reach this one's hub
