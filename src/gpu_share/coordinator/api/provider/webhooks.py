"""A provider's webhooks (docs/webhooks.md): signing secret, endpoints (payout events),
delivery log."""

from gpu_share.coordinator.api.auth import require
from gpu_share.coordinator.api.webhooks import build
from gpu_share.coordinator.core.principals import ProviderCaller

router = build("/v1/provider/webhooks", require(ProviderCaller))
