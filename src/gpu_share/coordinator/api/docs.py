"""The API's own documentation: the OpenAPI document (JSON and YAML) and Swagger UI.

FastAPI documents its 422 as `HTTPValidationError`; ours is the one error shape of
SPEC §1.8, so the generated document is rewritten once to say so.
"""

from collections.abc import Callable
from typing import Any

import yaml
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response

from gpu_share.protocol.errors import ErrorResponse

STATIC_PATH = "/static"  # where app.py mounts web/static


def _openapi_with_one_error_shape(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI documents its 422 as `HTTPValidationError`; ours is the §1.8 shape."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            error_ref = "#/components/schemas/ErrorResponse"
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for status, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        refs = {media.get("schema", {}).get("$ref") for media in content.values()}
                        if status == "422" or error_ref in refs:
                            # errors are JSON whatever the route's success media type
                            response["content"] = {
                                "application/json": {"schema": {"$ref": error_ref}}
                            }
                        if status == "422":
                            response["description"] = _VALIDATION_DESCRIPTION
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            components.setdefault(
                "ErrorResponse",
                ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}"),
            )
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


_VALIDATION_DESCRIPTION = (
    "Invalid input (VALIDATION_ERROR) or checksum mismatch (CHECKSUM_MISMATCH)"
)


def install(app: FastAPI) -> None:
    app.openapi = _openapi_with_one_error_shape(app)  # type: ignore[method-assign]

    @app.get("/openapi.yaml", include_in_schema=False)
    async def openapi_yaml() -> Response:
        text = yaml.safe_dump(app.openapi(), sort_keys=False, allow_unicode=True)
        return Response(text, media_type="application/yaml")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        """Swagger UI from this server's own copy of its assets (works without internet)."""
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="GPU Share API",
            swagger_js_url=f"{STATIC_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_PATH}/favicon-32x32.png",
            swagger_ui_parameters={"persistAuthorization": True, "tryItOutEnabled": True},
        )
