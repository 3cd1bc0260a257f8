"""The words of every mail the platform sends (plain text): confirming an applicant's
email, about an application, and about a benchmark that delists or relists a GPU."""

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import ProviderApplicationRow, ProviderRow
from gpu_share.coordinator.services.mail.headers import header_text
from gpu_share.coordinator.services.mail.outbox import Mail, enqueue
from gpu_share.protocol.common import ApplicationSubmitted

NAMED_MAX = 100  # of a name a node chose, in a subject

SIGNATURE = "\n-- \nGPU Share\n"


def install_command(base_url: str, enrollment_token: str) -> str:
    return f"curl -fsSL {base_url}/agent/install.sh | sudo bash -s -- --token {enrollment_token}"


async def ask_to_confirm(
    session: AsyncSession,
    application_id: str,
    to: str,
    what: str,
    confirm_url: str,
    valid_days: int,
    now: datetime,
) -> ApplicationSubmitted:
    """Queue the mail with the link that confirms an application `what` ("to provide
    GPUs"), and the answer for the applicant: words from nothing but what they sent."""
    mail = confirm_email(to, what, confirm_url, valid_days)
    await enqueue(session, f"{application_id}:confirm", mail, now)
    return ApplicationSubmitted(
        email=to,
        confirm_within_days=valid_days,
        message=f"We mailed a link to {to}. Open it within {valid_days} days to confirm your "
        "email: your application is reviewed from then on.",
    )


def confirm_email(to: str, what: str, confirm_url: str, valid_days: int) -> Mail:
    """The link that makes an application count. It carries none of the applicant's words:
    until the link is opened the address may be anyone's, and this mail must not take a
    stranger's message to them."""
    return Mail(
        to=to,
        subject=f"Confirm your email to apply {what}",
        body="Hello,\n\n"
        f"someone, we hope you, applied {what} on GPU Share with this email address. Open "
        f"this link within {valid_days} days to confirm that it is yours; the application "
        f"is reviewed from then on:\n{confirm_url}\n\n"
        "If you did not apply, ignore this mail: the application is deleted unread.\n" + SIGNATURE,
    )


def _hello(row: ProviderApplicationRow) -> str:
    return f"Hello {row.full_name},\n\n"


def received(row: ProviderApplicationRow, status_url: str) -> Mail:
    return Mail(
        to=row.email,
        subject="We received your application to provide GPUs",
        body=_hello(row)
        + "thank you for applying to provide GPUs on GPU Share. We review applications "
        "within 1 to 3 working days and will write to you with the decision.\n\n"
        f"Follow your application here (keep this link private):\n{status_url}\n" + SIGNATURE,
    )


def approved(row: ProviderApplicationRow, claim_url: str, base_url: str, valid_days: int) -> Mail:
    return Mail(
        to=row.email,
        subject="Your application is approved: set up your machines",
        body=_hello(row) + f"your application is approved as a {row.tier} provider.\n\n"
        f"1. Open this link to see your provider key and your agent enrollment token. "
        f"It works once, for {valid_days} days:\n   {claim_url}\n\n"
        "2. On each GPU machine, install and start the agent (it runs jobs isolated and "
        "reports to the platform):\n"
        f"   curl -fsSL {base_url}/agent/install.sh | sudo bash -s -- --token <enrollment token>\n"
        "   With Docker and the NVIDIA container toolkit, add --docker to run the agent "
        "image instead.\n\n"
        f"3. Sign in at {base_url}/signin with your provider key: your machines appear "
        "Online within a minute of the agent starting.\n" + SIGNATURE,
    )


def rejected(row: ProviderApplicationRow) -> Mail:
    return Mail(
        to=row.email,
        subject="About your application to provide GPUs",
        body=_hello(row)
        + "thank you for your interest. We cannot accept your application at this time.\n\n"
        f"The reason: {row.message}\n\n"
        "You are welcome to apply again when this changes.\n" + SIGNATURE,
    )


def info_requested(row: ProviderApplicationRow, status_url: str) -> Mail:
    return Mail(
        to=row.email,
        subject="We need a little more about your application",
        body=_hello(row) + "to finish reviewing your application we need more information:\n\n"
        f"{row.message}\n\n"
        f"Please update your application here:\n{status_url}\n" + SIGNATURE,
    )


# Benchmarks (SPEC §3.3): a GPU (or a CPU node) delisted by its benchmark, and relisted.
# The node names itself and its GPUs: those names go into the mail on one short line each.


def _named(what_a_node_said: str) -> str:
    return header_text(what_a_node_said, NAMED_MAX)


def _hello_provider(provider: ProviderRow) -> str:
    return f"Hello {provider.name},\n\n"


def benchmark_delisted(
    provider: ProviderRow, hostname: str, what: str, reason: str, page_url: str
) -> Mail:
    what, hostname = _named(what), _named(hostname)
    return Mail(
        to=provider.email,
        subject=f"{what} on {hostname} is delisted after its benchmark",
        body=_hello_provider(provider)
        + f"the latest benchmark of {what} on {hostname} did not pass, so it takes no new "
        "work and is hidden from the marketplace until a benchmark passes.\n\n"
        f"What failed:\n{reason}\n\n"
        "Check for throttling (temperature, power limits), other processes on the GPU, and "
        "the driver. The agent benchmarks again every day; an admin can ask for a run "
        "sooner. The figures and their references:\n"
        f"{page_url}\n" + SIGNATURE,
    )


def benchmark_relisted(
    provider: ProviderRow, hostname: str, what: str, score: float, page_url: str
) -> Mail:
    what, hostname = _named(what), _named(hostname)
    return Mail(
        to=provider.email,
        subject=f"{what} on {hostname} is listed again",
        body=_hello_provider(provider)
        + f"{what} on {hostname} passed its latest benchmark (score {score:.2f}), so it is "
        "listed again and takes work.\n\n"
        f"The figures:\n{page_url}\n" + SIGNATURE,
    )
