// Starts Swagger UI on /docs with the options the page carries as JSON data: a file, so
// the page's policy can forbid inline script (script-src 'self').
"use strict";

window.ui = SwaggerUIBundle({
  ...JSON.parse(document.getElementById("swagger-options").textContent),
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
