"""The API's own documentation: the OpenAPI document (JSON and YAML) and Swagger UI.

FastAPI documents its 422 as `HTTPValidationError`; ours is the one error shape of
SPEC §1.8, so the generated document is rewritten once to say so.

Swagger UI's page is ours rather than FastAPI's, whose page starts Swagger with an inline
script: here a static script (`swagger-init.js`) starts it with the options the page
carries as JSON data (which no browser runs), so /docs holds to the policy of every page,
`script-src 'self'` (`http/security_headers.py`).
"""

import json
from collections.abc import Callable
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response

from gpu_share.protocol.errors import ErrorResponse

STATIC_PATH = "/static"  # where app.py mounts web/static
SWAGGER_OPTIONS = {
    "url": "/openapi.json",
    "dom_id": "#swagger-ui",
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
    "persistAuthorization": True,
    "tryItOutEnabled": True,
    # Tags start folded: a tag opens with a click. Swagger UI drew only the first nine
    # operations of a document of more than about 130 with every tag open, and this
    # one has 140; folded, it lists every tag.
    "docExpansion": "none",
}
# Script content is not HTML-decoded: "<" is escaped the JSON way, so no "</script>" ends it.
OPTIONS_JSON = json.dumps(SWAGGER_OPTIONS).replace("<", "\\u003c")
SWAGGER_PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link rel="stylesheet" href="{STATIC_PATH}/swagger-ui.css">
<link rel="icon" href="{STATIC_PATH}/favicon-32x32.png">
<title>GPU Share API</title>
</head>
<body>
<div id="swagger-ui"></div>
<script type="application/json" id="swagger-options">{OPTIONS_JSON}</script>
<script src="{STATIC_PATH}/swagger-ui-bundle.js"></script>
<script src="{STATIC_PATH}/swagger-init.js"></script>
</body>
</html>
"""


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
                tags=TAGS,
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


# The order Swagger UI shows: where a tenant starts first, the agent's internals last.
TAGS = [
    {"name": "invokes", "description": "Run a job: submit, follow, cancel (start here)"},
    {"name": "artifacts", "description": "Upload models, configs and inputs"},
    {"name": "sessions", "description": "Keep a model loaded for a series of forward calls"},
    {"name": "reservations", "description": "Book GPUs for a period"},
    {"name": "billing", "description": "Balance, usage and charges"},
    {"name": "webhooks", "description": "Signed events: secret, endpoints, delivery log"},
    {"name": "discovery", "description": "Health, nodes, offers and runtimes"},
    {"name": "applications", "description": "Apply for a tenant account"},
    {"name": "provider applications", "description": "Apply to provide GPUs"},
    {"name": "provider", "description": "A provider's account, machines and earnings"},
    {"name": "prices", "description": "A provider's prices per GPU model"},
    {"name": "reliability", "description": "A provider's reliability scores"},
    {"name": "benchmarks", "description": "Measured GPU performance"},
    {"name": "admin", "description": "Review, keys, top-ups, payouts, trust"},
    {"name": "agent installation", "description": "The agent's install script and package"},
    {"name": "agent", "description": "The agent protocol (used by the agent, not by people)"},
]

_VALIDATION_DESCRIPTION = (
    "Invalid input (VALIDATION_ERROR) or checksum mismatch (CHECKSUM_MISMATCH)"
)


async def openapi_yaml(request: Request) -> Response:
    text = yaml.safe_dump(request.app.openapi(), sort_keys=False, allow_unicode=True)
    return Response(text, media_type="application/yaml")


async def swagger_ui() -> HTMLResponse:
    """Swagger UI from this server's own copy of its assets (works without internet)."""
    return HTMLResponse(SWAGGER_PAGE)


def install(app: FastAPI) -> None:
    app.openapi = _openapi_with_one_error_shape(app)  # type: ignore[method-assign]
    # Module-level endpoints, never closures over `app`: FastAPI caches facts about
    # each endpoint function (bounded, 4,096 entries), and a closure there would keep
    # its whole app alive long after it is gone (thousands, in a test run).
    app.add_api_route("/openapi.yaml", openapi_yaml, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs", swagger_ui, methods=["GET"], include_in_schema=False)
