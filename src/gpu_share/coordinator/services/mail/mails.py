"""The words of every mail the platform sends (plain text): about an application, and
about a benchmark that delists or relists a GPU."""

from gpu_share.coordinator.core.orm import ProviderApplicationRow, ProviderRow
from gpu_share.coordinator.services.mail.outbox import Mail

SIGNATURE = "\n-- \nGPU Share\n"


def install_command(base_url: str, enrollment_token: str) -> str:
    return f"curl -fsSL {base_url}/agent/install.sh | sudo bash -s -- --token {enrollment_token}"


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


def _hello_provider(provider: ProviderRow) -> str:
    return f"Hello {provider.name},\n\n"


def benchmark_delisted(
    provider: ProviderRow, hostname: str, what: str, reason: str, page_url: str
) -> Mail:
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
    return Mail(
        to=provider.email,
        subject=f"{what} on {hostname} is listed again",
        body=_hello_provider(provider)
        + f"{what} on {hostname} passed its latest benchmark (score {score:.2f}), so it is "
        "listed again and takes work.\n\n"
        f"The figures:\n{page_url}\n" + SIGNATURE,
    )
