"""Server-rendered pages and the assets they ship with (no CDN: the platform works offline)."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
