"""Server-rendered pages and the assets they ship with (no CDN: the platform works offline)."""

from pathlib import Path

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
TEMPLATE_DIR = HERE / "templates"
