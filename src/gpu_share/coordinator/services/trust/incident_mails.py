"""The mail a provider gets when one of their nodes is caught (docs/trust.md, "When a node
is caught"): what was found, what it cost, what happens next. It names the node and the
kind of difference, never the tenant's job or data."""

from gpu_share.coordinator.core.orm import NodeRow, ProviderRow, TrustIncidentRow
from gpu_share.coordinator.services.mail.mails import SIGNATURE
from gpu_share.coordinator.services.mail.outbox import Mail
from gpu_share.protocol.money import usdc_text

HOSTNAME_MAX = 80


def cause(incident_id: str) -> str:
    return f"trust:{incident_id}:caught"


def caught(
    provider: ProviderRow,
    node: NodeRow,
    incident: TrustIncidentRow,
    *,
    suspended: bool,
    base_url: str,
) -> Mail:
    hostname = " ".join(node.hostname.split())[:HOSTNAME_MAX]
    where = (
        f"The evidence and the amounts: {base_url}/provider/incidents\n"
        if base_url
        else "The evidence and the amounts are under Incidents when you sign in.\n"
    )
    what = str(incident.evidence.get("reason", "its result differed from a trusted re-run"))
    next_steps = (
        "This is your second offence: your provider account is suspended and every one of "
        "your nodes is quarantined. Write to us if you believe this is wrong.\n\n"
        if suspended
        else "A second offence suspends your provider account. If you believe this is "
        "wrong (a faulty GPU can produce wrong results too), write to us.\n\n"
    )
    return Mail(
        to=provider.email,
        subject=f"Node {hostname} is quarantined: a spot check caught a wrong result",
        body=f"Hello {provider.name},\n\n"
        f"a job your node {hostname} ({node.id}) ran was run again on a trusted machine, "
        f"twice, and the results disagree: {what}.\n\n"
        "What follows, as the trust rules say (docs/trust.md):\n"
        "- the node is quarantined: it gets no new work and its sessions are ended;\n"
        "- the tenant got the trusted machine's result at no cost;\n"
        f"- every job the node ran within the earnings hold was refunded to its tenant "
        f"({usdc_text(incident.refunded_micro)} USDC);\n"
        f"- your held earnings were forfeited ({usdc_text(incident.forfeited_micro)} USDC).\n\n"
        + next_steps
        + where
        + SIGNATURE,
    )
