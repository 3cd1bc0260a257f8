"""What the admin's pages share: a query or form value read as an enum member or as a
model (each problem put next to the field it is about), and the page an unknown id gets."""

from enum import StrEnum
from typing import Any, TypeVar

from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from gpu_share.coordinator.web.pages import Browser

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: str) -> E | None:
    """The enum member a query or form value names; None for anything else."""
    try:
        return kind(value)
    except ValueError:
        return None


def validated(
    model: type[M], values: dict[str, str], errors: dict[str, str], ids: dict[str, str]
) -> M | None:
    """The model, or each problem put next to its field (`ids` maps model fields to ids)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else ""
            errors.setdefault(ids.get(name, "form"), _message(problem))
        return None


def _message(problem: Any) -> str:
    if problem.get("type") == "string_too_short" and not problem.get("input"):
        return "Required"
    message = str(problem.get("msg", "invalid")).removeprefix("Value error, ")
    return message[:1].upper() + message[1:]


def not_found(browser: Browser, message: str) -> Response:
    return browser.render("public/message.html", status=404, title="Not found", message=message)
