"""The tenant's Webhooks page (`web/webhooks.py`): secret, endpoints, delivery log."""

from gpu_share.coordinator.core.principals import TenantCaller
from gpu_share.coordinator.web.pages import signed_in
from gpu_share.coordinator.web.webhooks import build

router = build("/console/webhooks", signed_in(TenantCaller))
