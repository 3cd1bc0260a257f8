"""How pages show times, sizes, money, scores, statuses and names: Jinja2 filters, one
place."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpu_share.coordinator.services.providers import reliability_formula
from gpu_share.protocol.artifacts import Artifact
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.names import node_display_name
from gpu_share.protocol.reliability import Reliability, percent_text


def when(moment: datetime | None) -> str:
    """An absolute UTC time a person can read; the exact one is in the title attribute."""
    if moment is None:
        return "—"
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    seconds = int((now - moment).total_seconds())
    if seconds < 5:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def size(count: int | None) -> str:
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def megabytes(mb: int | None) -> str:
    return size(mb * 1024 * 1024) if mb is not None else "—"


def usdc(micro: int | None) -> str:
    return "—" if micro is None else usdc_text(micro) + " USDC"


def usdc_figure(micro: int | None) -> str:
    """The amount alone, for a page that shows its unit apart ("12.5", then "USDC")."""
    return "—" if micro is None else usdc_text(micro)


def percent(fraction: float | None) -> str:
    return "—" if fraction is None else percent_text(fraction)


def reliability(published: Reliability | None, score: float | None = None) -> str:
    """A node's reliability score: a percentage once the node has a record of its own,
    until then where it starts (its figures would be the start, not evidence). `score`
    is the bare score where the published one with its evidence is not at hand."""
    if published is None:
        return "not yet scored" if score is None else percent(score)
    if not reliability_formula.history(published).any:
        return no_history(reliability_formula.start_of(published))
    return percent(published.score)


def no_history(start: float) -> str:
    return f"New — no history yet (starts at {percent(start)})"


def reliability_parts(published: Reliability | None) -> str:
    """The score's components, each a percentage or "no history yet" ("" for a node
    without history at all: `reliability` says so)."""
    if published is None:
        return ""
    seen = reliability_formula.history(published)
    if not seen.any:
        return ""
    parts = (
        ("uptime", published.uptime, seen.uptime),
        ("jobs", published.completion, seen.completion),
        ("stability", published.stability, seen.stability),
    )
    return " · ".join(
        f"{name} {percent(value) if known else 'no history yet'}" for name, value, known in parts
    )


def label(value: Any) -> str:
    """An enum or snake_case value as words: info_requested → info requested."""
    return str(getattr(value, "value", value)).replace("_", " ")


def short_id(value: str) -> str:
    """`art_…x7k2ab`: an id's prefix and its last, random, characters; enough to tell
    apart the few a list shows (the start of an id is its creation time, shared by
    things made together)."""
    prefix, _, rest = value.partition("_")
    return f"{prefix}_…{rest[-6:]}" if len(rest) > 8 else value


def artifact_name(artifact: Artifact) -> str:
    """`model.onnx (art_…x7k2ab)`, or the id of an artifact uploaded without a name."""
    if artifact.name is None:
        return artifact.id
    return f"{artifact.name} ({short_id(artifact.id)})"


def node_name(node: Any) -> str:
    """A machine as pages call it: its provider's label, else its hostname, else its id.
    Takes anything with `label` and an `id` or `node_id` (a hostname where it has one)."""
    node_id = str(getattr(node, "id", None) or getattr(node, "node_id", ""))
    return node_display_name(getattr(node, "label", None), getattr(node, "hostname", None), node_id)


FILTERS: dict[str, Callable[..., str]] = {
    "when": when,
    "ago": ago,
    "size": size,
    "megabytes": megabytes,
    "usdc": usdc,
    "usdc_figure": usdc_figure,
    "percent": percent,
    "reliability": reliability,
    "reliability_parts": reliability_parts,
    "no_history": no_history,
    "label": label,
    "short_id": short_id,
    "artifact_name": artifact_name,
    "node_name": node_name,
}
