"""Clear messages when a command needs an extra that is not installed."""

import importlib.util
import sys


def require_extra(extra: str, *modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"gpu-share: this command needs the '{extra}' extra "
            f"(missing: {', '.join(missing)}); install it with: pip install 'gpu-share[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(2)
