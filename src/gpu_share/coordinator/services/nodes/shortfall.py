"""Why no machine can take a request, in a sentence a tenant understands (SPEC §1.5, §4.1).

Placement names the furthest constraint any online node got to (`placement.nothing_meets`);
programs read it in `error.details.constraint`. People read this: what was asked, which
part of it no machine online meets, what the closest machine has instead, and what would
work. The closest are the machines that met everything before that constraint, in
placement's order, so relaxing that one thing to what they have would find one of them.
"""

import math
from collections.abc import Sequence
from datetime import datetime

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    cuda_of,
    listed_gpu,
    reliability_of,
    unmet,
)
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.reliability import percent_text

# A machine that met everything up to the missed constraint, with the requirements it was
# held to (a reservation's differ by the GPU runtimes each machine serves).
Near = tuple[NodeRow, Requirements]

LATER = "try again later"


def explain(req: Requirements, missed: str, online: Sequence[NodeRow], now: datetime) -> str:
    """Why none of the `online` machines serves `req` now, `missed` being what placement
    names (`nothing_meets`)."""
    near = [(node, req) for node in online if unmet(node, req, now) == missed]
    return sentence(req, missed, near, online)


def sentence(
    req: Requirements,
    missed: str,
    near: Sequence[Near],
    online: Sequence[NodeRow],
    *,
    reservation: bool = False,
) -> str:
    """The message, in the form: No machine online right now can <what was asked>: <why>.
    <What would work>."""
    what = asked(req, reservation=reservation)
    if missed == "online" and not online:
        return (
            f"No machine is online right now to {what}. Try again later: machines come online "
            "as their providers start them."
        )
    why, fix = _why(req, missed, near, online, reservation)
    return f"No machine online right now can {what}: {why}. {fix[0].upper()}{fix[1:]}."


def asked(req: Requirements, *, reservation: bool = False) -> str:
    """The request in words: "run onnx_cuda on 2 H100 GPUs with at least 16 GB of GPU
    memory each, in region eu-west"; a reservation's names no runtime."""
    gpus = req.gpus if reservation or req.runtime.needs_gpu else 0
    unit = f"{req.gpu_model} GPU" if req.gpu_model else "GPU"
    count = f"{gpus} {unit}{'' if gpus == 1 else 's'}"
    if reservation:
        words = f"take a reservation of {count}"
    else:
        words = f"run {req.runtime.value}" + (f" on {count}" if gpus else "")
    if req.min_vram_mb:
        words += f" with at least {_gb(req.min_vram_mb)} of GPU memory"
        words += " each" if gpus > 1 else ""
    extra = []
    if req.region:
        extra.append(f"in region {req.region}")
    if req.tier:
        extra.append(f"at the {req.tier} tier")
    if req.isolated_only:
        extra.append("in an isolating sandbox")
    if req.max_price_micro is not None:
        extra.append(f"for at most {usdc_text(req.max_price_micro)} USDC per GPU-hour")
    if req.min_reliability is not None:
        extra.append(f"with a reliability score of at least {percent_text(req.min_reliability)}")
    if reservation:  # proven hardware goes without saying: reservations rent only that
        extra.append("for the whole period")
    elif req.require_verified:
        extra.append("on hardware proven by a hardware challenge")
    return " ".join([words, ", ".join(extra)]) if extra else words


def _why(
    req: Requirements,
    missed: str,
    near: Sequence[Near],
    online: Sequence[NodeRow],
    reservation: bool,
) -> tuple[str, str]:
    """Why nobody meets `missed`, and what would work."""
    runtime = "a GPU" if reservation else req.runtime.value
    if missed == "online":  # some serve it, but are taken (reserved, or a session's GPU)
        return "every machine that could is taken by reservations or sessions", LATER
    if missed == "runtime":
        return _runtime(req, online, reservation)
    if missed == "listed":
        return (
            f"every machine with {runtime} is delisted right now (by an admin, after a failed "
            "benchmark, or caught returning wrong results)",
            LATER,
        )
    if missed == "availability window":
        if reservation:
            return (
                "every machine that could is outside its provider's hours for part of the period",
                "pick a period inside their hours (GET /v1/nodes shows them), or " + LATER,
            )
        return "every machine that could is outside its provider's hours right now", LATER
    if missed == "gpus":
        return _gpus(req, near, reservation)
    if missed == "verified":
        return _verified(req, reservation)
    return _filters(req, missed, [node for node, _ in near])


def _runtime(req: Requirements, online: Sequence[NodeRow], reservation: bool) -> tuple[str, str]:
    served = sorted({r for node in online for r in node.runtimes})
    one, runtime = len(online) == 1, req.runtime.value
    if reservation:
        why = "offers no GPU" if one else "offers a GPU"
    else:
        why = f"does not run {runtime}" if one else f"runs {runtime}"
    why = (
        f"the one machine online {why}"
        if one
        else f"none of the {len(online)} machines online {why}"
    )
    if served:
        why += f" ({'it' if one else 'they'} run{'s' if one else ''} {', '.join(served)})"
    twin = runtime.replace("_cuda", "_cpu")
    if not reservation and req.runtime.needs_gpu and twin in served:
        return why, f"try {twin}, which runs on CPUs, or {LATER}"
    return why, LATER


def _gpus(req: Requirements, near: Sequence[Near], reservation: bool) -> tuple[str, str]:
    """Which of the GPU requirements nobody meets: the model, the memory, the CUDA version
    the runtime needs, or the count on one machine, each among the GPUs that met the
    ones before it."""
    gpus = [(node, r, g) for node, r in near for g in node.gpus if listed_gpu(node, g)]
    if not gpus:
        return "none of them has a GPU listed (a GPU is delisted while its benchmark fails)", LATER
    if req.gpu_model:
        models = sorted({str(g.get("model", "")) for _, _, g in gpus})
        wanted = req.gpu_model.lower()
        gpus = [(n, r, g) for n, r, g in gpus if wanted in str(g.get("model", "")).lower()]
        if not gpus:
            return (
                f"none has a GPU of model {req.gpu_model} (they have {', '.join(models)})",
                f"ask for one of those models, or {LATER}",
            )
    if req.min_vram_mb:
        most = max(int(g.get("vram_mb", 0)) for _, _, g in gpus)
        gpus = [(n, r, g) for n, r, g in gpus if int(g.get("vram_mb", 0)) >= req.min_vram_mb]
        if not gpus:
            return f"the closest has {_gb(most)}", f"ask for {_gb(most)} or less, or {LATER}"
    fits = [(n, r, g) for n, r, g in gpus if _new_enough(r, g)]
    if not fits:
        runtime = gpus[0][1].runtime
        wanted_cuda = ".".join(map(str, runtime.min_cuda or ()))
        newest = max((c for _, _, g in gpus if (c := cuda_of(g.get("cuda_version")))), default=None)
        has = f"the newest has {'.'.join(map(str, newest))}" if newest else "none reports one"
        fix = LATER if reservation else f"try a *_cpu runtime, or {LATER}"
        return f"{runtime.value} needs CUDA {wanted_cuda} or newer and {has}", fix
    per_node: dict[str, set[str]] = {}
    for node, _, gpu in fits:
        per_node.setdefault(node.id, set()).add(str(gpu.get("uuid", gpu.get("index"))))
    most = max(len(found) for found in per_node.values())
    such = "that fit" if req.gpu_model or req.min_vram_mb else "GPUs"
    if most == 1:
        such = "that fits" if req.gpu_model or req.min_vram_mb else "GPU"
    return (
        f"the closest has {most} {such}",
        f"ask for {most} GPU{'' if most == 1 else 's'}, or {LATER}",
    )


def _new_enough(req: Requirements, gpu: dict[str, object]) -> bool:
    wanted = req.runtime.min_cuda
    cuda = cuda_of(gpu.get("cuda_version"))
    return wanted is None or (cuda is not None and cuda >= wanted)


def _verified(req: Requirements, reservation: bool) -> tuple[str, str]:
    why = (
        "the machines that have it have not proven their hardware by a hardware challenge "
        "yet (docs/trust.md)"
    )
    if reservation:
        return why, f"{LATER}: reservations rent proven GPUs only"
    if req.require_verified:
        return why, f"set require_verified to false, or {LATER}"
    return why, (
        f"leave out gpu_model and min_vram_gb (unproven GPUs may run work that names "
        f"neither), or {LATER}"
    )


def _filters(req: Requirements, missed: str, near: Sequence[NodeRow]) -> tuple[str, str]:
    """The filters checked after the hardware: region, tier, sandbox, price, reliability."""
    if missed == "region":
        regions = sorted({node.region for node in near if node.region})
        where = f" (they are in {', '.join(regions)})" if regions else ""
        return f"none is in region {req.region}{where}", f"leave the region out, or {LATER}"
    if missed == "tier":
        tiers = sorted({node.tier for node in near})
        return (
            f"none is at the {req.tier} tier (they are {', '.join(tiers)})",
            f"leave the tier out, or {LATER}",
        )
    if missed == "isolated_only":
        return (
            "none runs jobs in an isolating sandbox",
            f"leave isolated_only off (the job then runs as a plain process), or {LATER}",
        )
    if missed == "max_price_per_gpu_hour":
        cheapest = min(node.price_per_gpu_hour_micro or 0 for node in near)
        price = f"{usdc_text(cheapest)} USDC per GPU-hour"
        return f"the cheapest asks {price}", f"pay up to {price}, or {LATER}"
    if missed == "min_reliability":
        scores = [s for node in near if (s := reliability_of(node)) is not None]
        if not scores:
            return "none has a reliability score yet", f"leave min_reliability out, or {LATER}"
        best = percent_text(math.floor(max(scores) * 1000) / 1000)  # what asking for it finds
        return f"the most reliable has {best}", f"ask for {best} or less, or {LATER}"
    return f"none meets {missed}", f"relax {missed}, or {LATER}"


def _gb(mb: int) -> str:
    """MiB as the decimal GB cards are sold by and `min_vram_gb` asks in."""
    return f"{mb * 1024**2 / 1000**3:.3g} GB"
