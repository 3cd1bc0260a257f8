"""A tenant's webhooks (docs/webhooks.md): signing secret, endpoints, delivery log."""

from gpu_share.coordinator.api.auth import require
from gpu_share.coordinator.api.webhooks import build
from gpu_share.coordinator.core.principals import TenantCaller

router = build("/v1/webhooks", require(TenantCaller))
