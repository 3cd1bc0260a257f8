"""The provider application as an HTML form: flat fields in, the API's model out, and each
validation message put back next to the field it is about.

Fields: full_name, email, company, ups, commitment_months, maintenance_notes, and per
GPU entry `gpu-<n>-<name>` (model, other_model, count, system_ram_gb,
internet_up_gbps, internet_down_gbps, location, availability, timezone, days, start, end).
"""

import re
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import FormData

from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.protocol import provider_applications as wire

GPU_FIELDS = (
    "model",
    "other_model",
    "count",
    "system_ram_gb",
    "internet_up_gbps",
    "internet_down_gbps",
    "location",
    "availability",
    "timezone",
    "days",
    "start",
    "end",
)
TOP_FIELDS = ("full_name", "email", "company", "ups", "commitment_months", "maintenance_notes")
MAX_ENTRIES = 32
_GPU_KEY = re.compile(r"^gpu-(\d{1,2})-(\w+)$")


def blank_form() -> dict[str, str]:
    values = dict.fromkeys(TOP_FIELDS, "")
    values["commitment_months"] = "12"
    values.update(_blank_entry(0))
    return values


def _blank_entry(n: int) -> dict[str, str]:
    entry = {f"gpu-{n}-{name}": "" for name in GPU_FIELDS}
    entry.update(
        {
            f"gpu-{n}-count": "1",
            f"gpu-{n}-availability": "always",
            f"gpu-{n}-timezone": "UTC",
            f"gpu-{n}-start": "08:00",
            f"gpu-{n}-end": "20:00",
        }
    )
    return entry


def entry_indices(values: dict[str, str]) -> list[int]:
    return sorted({int(m.group(1)) for key in values if (m := _GPU_KEY.match(key))})[:MAX_ENTRIES]


def form_values_of(
    form: FormData | None, application: wire.ProviderApplication | None = None
) -> dict[str, str]:
    """What the form shows: what was posted, or an application to amend."""
    if form is not None:
        values = {key: value.strip() for key, value in form.items() if isinstance(value, str)}
        for n in entry_indices(values):
            days = [d for d in form.getlist(f"gpu-{n}-days") if isinstance(d, str)]
            values[f"gpu-{n}-days"] = ",".join(days)
        values["ups"] = "yes" if form.get("ups") == "yes" else ""
        return values
    assert application is not None
    values = {
        "full_name": application.full_name,
        "email": application.email,
        "company": application.company or "",
        "ups": "yes" if application.ups else "",
        "commitment_months": str(application.commitment_months),
        "maintenance_notes": application.maintenance_notes or "",
    }
    for n, gpu in enumerate(application.gpus):
        window = gpu.availability.windows[0] if gpu.availability.windows else None
        values.update(
            {
                f"gpu-{n}-model": gpu.model,
                f"gpu-{n}-other_model": gpu.other_model or "",
                f"gpu-{n}-count": str(gpu.count),
                f"gpu-{n}-system_ram_gb": str(gpu.system_ram_gb),
                f"gpu-{n}-internet_up_gbps": f"{gpu.internet_up_gbps:g}",
                f"gpu-{n}-internet_down_gbps": f"{gpu.internet_down_gbps:g}",
                f"gpu-{n}-location": gpu.location,
                f"gpu-{n}-availability": "always" if gpu.availability.always else "schedule",
                f"gpu-{n}-timezone": gpu.availability.timezone,
                f"gpu-{n}-days": ",".join(d.value for d in window.days) if window else "",
                f"gpu-{n}-start": window.start if window else "08:00",
                f"gpu-{n}-end": window.end if window else "20:00",
            }
        )
    return values


def application_from_form(
    values: dict[str, str],
) -> tuple[wire.ProviderApplicationCreate | None, dict[str, str]]:
    """The application, or the messages to show next to each field."""
    errors: dict[str, str] = {}
    gpus: list[dict[str, Any]] = []
    indices = entry_indices(values)
    if not indices:
        errors["gpu-0-model"] = "add at least one GPU"
    for n in indices:
        gpus.append(_entry(values, n, errors))
    commitment = values.get("commitment_months", "")
    body: dict[str, Any] = {
        "full_name": values.get("full_name", ""),
        "email": values.get("email", ""),
        "company": values.get("company") or None,
        "gpus": gpus,
        "ups": values.get("ups") == "yes",
        "commitment_months": int(commitment) if commitment.isdigit() else commitment,
        "maintenance_notes": values.get("maintenance_notes") or None,
    }
    try:
        application = wire.ProviderApplicationCreate.model_validate(body)
    except ValidationError as exc:
        for problem in exc.errors():
            name = _field_name(tuple(problem["loc"]), indices)
            errors.setdefault(name, _message(problem))
        return None, in_form_order(errors)
    if errors:
        return None, in_form_order(errors)
    return application, {}


def _entry(values: dict[str, str], n: int, errors: dict[str, str]) -> dict[str, Any]:
    def get(name: str) -> str:
        return values.get(f"gpu-{n}-{name}", "")

    def number(name: str, kind: type[int] | type[float]) -> int | float | str:
        raw = get(name)
        try:
            return kind(raw)
        except ValueError:
            errors.setdefault(f"gpu-{n}-{name}", "Enter a number" if raw else "This is required")
            return raw

    model = get("model")
    if not model:
        errors[f"gpu-{n}-model"] = "Choose a model (or Other)"
    elif not gpu_catalog.is_known(model):
        errors[f"gpu-{n}-model"] = "Pick a model from the list, or Other"
    scheduled = get("availability") == "schedule"
    availability: dict[str, Any] = {"always": not scheduled, "timezone": get("timezone") or "UTC"}
    if scheduled:
        days = [d for d in get("days").split(",") if d]
        availability["windows"] = [{"days": days, "start": get("start"), "end": get("end")}]
    return {
        "model": model,
        "other_model": get("other_model") or None,
        "count": number("count", int),
        "system_ram_gb": number("system_ram_gb", int),
        "internet_up_gbps": number("internet_up_gbps", float),
        "internet_down_gbps": number("internet_down_gbps", float),
        "availability": availability,
        "location": get("location"),
    }


def _field_name(loc: tuple[Any, ...], indices: list[int]) -> str:
    if not loc:
        return "form"
    if loc[0] != "gpus":
        return str(loc[0])
    if len(loc) < 2:
        return f"gpu-{indices[0] if indices else 0}-model"
    n = indices[loc[1]] if isinstance(loc[1], int) and loc[1] < len(indices) else 0
    rest = [str(part) for part in loc[2:]]
    if not rest:  # the entry as a whole: other_model named or not
        return f"gpu-{n}-other_model"
    if rest[0] == "availability":
        if len(rest) == 1:
            return f"gpu-{n}-days"
        if rest[1] == "timezone":
            return f"gpu-{n}-timezone"
        if "days" in rest:
            return f"gpu-{n}-days"
        return f"gpu-{n}-end" if rest[-1] != "start" else f"gpu-{n}-start"
    return f"gpu-{n}-{rest[0]}"


LABELS = {
    "full_name": "Full name",
    "email": "Email",
    "company": "Company",
    "commitment_months": "Commitment",
    "maintenance_notes": "Maintenance notes",
    "model": "Model",
    "other_model": "Other model",
    "count": "How many",
    "system_ram_gb": "System RAM",
    "internet_up_gbps": "Upload",
    "internet_down_gbps": "Download",
    "location": "Location",
    "timezone": "Time zone",
    "days": "Days",
    "start": "From",
    "end": "Until",
}


def label_of(name: str) -> str:
    """`gpu-1-count` → "GPUs (2): How many"; a top-level field → its label."""
    match = _GPU_KEY.match(name)
    if match is None:
        return LABELS.get(name, name.replace("_", " ").capitalize())
    n, field = match.groups()
    entry = f"GPUs ({int(n) + 1})" if n != "0" else "GPUs"
    return f"{entry}: {LABELS.get(field, field)}"


def in_form_order(errors: dict[str, str]) -> dict[str, str]:
    def rank(name: str) -> tuple[int, int, int]:
        match = _GPU_KEY.match(name)
        if match is None:
            top = TOP_FIELDS.index(name) if name in TOP_FIELDS else -1
            return (0 if top < 3 else 2, top, 0)
        n, field = match.groups()
        return (1, int(n), GPU_FIELDS.index(field) if field in GPU_FIELDS else 99)

    return dict(sorted(errors.items(), key=lambda item: rank(item[0])))


def _message(problem: Any) -> str:
    if problem.get("type") in ("string_too_short", "missing") and problem.get("input") in (
        "",
        None,
    ):
        return "This is required"
    message = str(problem.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message[:1].upper() + message[1:] if message else "Invalid"
