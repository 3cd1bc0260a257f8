"""The provider's Webhooks page (`web/webhooks.py`): secret, payout endpoints, delivery log."""

from gpu_share.coordinator.core.principals import ProviderCaller
from gpu_share.coordinator.web.pages import signed_in
from gpu_share.coordinator.web.webhooks import build

router = build("/provider/webhooks", signed_in(ProviderCaller))
