"""DESIGN.md boundaries, checked on the source: one layer per folder, no import upward.

coordinator:  core  ←  storage  ←  replica  ←  services  ←  loops | http  ←  api | web  ←  app
              (api and web share what they take from a request through http, never
              each other); inside services, one package per domain, each used by
              another only through the modules its `__init__` makes public, the arrows
              between domains running one way (DOMAIN_USES).
everywhere:   protocol and netguard know nothing of the parts that use them;
              the agent never imports the coordinator; the SDK imports no server code;
              services never import FastAPI; the CLI imports servers only lazily,
              inside the commands that run them; the agent's benchmarks take what they
              need from the agent as an argument.
"""

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "gpu_share"

# The coordinator's layers, lowest first; a module may import its own folder and lower ranks.
COORDINATOR_RANKS = {
    "core": 0,
    "storage": 1,
    "migrations": 1,
    "replica": 2,
    "services": 3,
    "loops": 4,
    "http": 4,
    "api": 5,
    "web": 5,  # the same rank as api: neither imports the other
}
WIRING_RANK = 6  # app.py, embedded.py, migrate.py at the coordinator's root
SERVER_PACKAGES = ("gpu_share.coordinator", "gpu_share.agent", "gpu_share.testing")
WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str
    top_level: bool  # at module level (not inside a function)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


class _Collector(ast.NodeVisitor):
    def __init__(self, importer: str) -> None:
        self.importer = importer
        self.depth = 0
        self.found: list[Import] = []

    def _add(self, name: str) -> None:
        self.found.append(Import(self.importer, name, self.depth == 0))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # relative imports are not used in this code base
            base = self.importer.rsplit(".", node.level)[0]
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        for alias in node.names:
            candidate = f"{module}.{alias.name}"
            self._add(candidate if _is_module(candidate) else module)


def all_imports() -> list[Import]:
    found: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations/versions" in path.as_posix():
            continue
        collector = _Collector(module_name(path))
        collector.visit(ast.parse(path.read_text(), str(path)))
        found.extend(collector.found)
    return found


IMPORTS = all_imports()


def _coordinator_layer(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[:2] != ["gpu_share", "coordinator"] or len(parts) < 3:
        return None
    folder = parts[2]
    if folder in COORDINATOR_RANKS:
        return folder, COORDINATOR_RANKS[folder]
    return "wiring", WIRING_RANK


def test_no_coordinator_import_runs_upward_or_sideways() -> None:
    wrong = []
    for imp in IMPORTS:
        here, there = _coordinator_layer(imp.importer), _coordinator_layer(imp.imported)
        if here is None or there is None or here[0] == there[0]:
            continue
        if there[1] >= here[1]:
            wrong.append(f"{imp.importer} ({here[0]}) imports {imp.imported} ({there[0]})")
    assert not wrong, "\n".join(wrong)


def test_the_coordinator_root_holds_only_wiring() -> None:
    root = PACKAGE / "coordinator"
    loose = sorted(p.name for p in root.glob("*.py"))
    assert loose == ["__init__.py", "app.py", "embedded.py", "migrate.py"]


def _offenders(importer_prefix: str, forbidden: tuple[str, ...], *, top_only: bool) -> list[str]:
    return [
        f"{imp.importer} imports {imp.imported}"
        for imp in IMPORTS
        if (imp.importer == importer_prefix or imp.importer.startswith(importer_prefix + "."))
        and any(imp.imported == f or imp.imported.startswith(f + ".") for f in forbidden)
        and (imp.top_level or not top_only)
    ]


def test_the_agent_never_imports_the_coordinator() -> None:
    assert not _offenders("gpu_share.agent", ("gpu_share.coordinator",), top_only=False)


def test_services_never_import_a_web_framework() -> None:
    for layer in ("services", "core", "replica", "storage"):
        assert not _offenders(f"gpu_share.coordinator.{layer}", WEB_FRAMEWORKS, top_only=False)


def test_services_take_what_they_use_not_the_whole_replica() -> None:
    assert not _offenders(
        "gpu_share.coordinator.services", ("gpu_share.coordinator.replica.state",), top_only=False
    )


def test_the_sdk_imports_no_server_code() -> None:
    assert not _offenders("gpu_share.sdk", SERVER_PACKAGES, top_only=False)


def test_the_cli_imports_server_code_only_inside_the_commands_that_run_servers() -> None:
    assert not _offenders("gpu_share.cli", SERVER_PACKAGES, top_only=True)


@pytest.mark.parametrize(
    "package", ["gpu_share.protocol", "gpu_share.netguard", "gpu_share.challenge"]
)
def test_shared_packages_know_nothing_of_their_users(package: str) -> None:
    users = (*SERVER_PACKAGES, "gpu_share.sdk", "gpu_share.cli")
    assert not _offenders(package, users, top_only=False)


def test_the_collector_sees_an_upward_import() -> None:
    """The checks above would pass vacuously if the collector missed imports."""
    services = [i for i in IMPORTS if i.importer == "gpu_share.coordinator.services.work.leases"]
    assert any(i.imported == "gpu_share.coordinator.core.orm" for i in services)
    assert _coordinator_layer("gpu_share.coordinator.api.auth") == ("api", 5)


# What importing actually loads (the static checks cannot see import side effects).

HEAVY = ["fastapi", "sqlalchemy", "onnxruntime", "catboost", "starlette", "uvicorn"]


def modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in json.loads(out.stdout)}


@pytest.mark.parametrize("statement", ["import gpu_share", "import gpu_share.sdk"])
def test_sdk_import_pulls_in_no_server_or_runtime(statement: str) -> None:
    loaded = modules_loaded_by(statement)
    assert not loaded & set(HEAVY), f"{statement} loaded {sorted(loaded & set(HEAVY))}"


def test_the_challenge_arithmetic_pulls_in_no_server_or_runtime() -> None:
    """The coordinator and the agent both load it; it must bring neither's weight."""
    loaded = modules_loaded_by(
        "import gpu_share.challenge.chain, gpu_share.challenge.packing, "
        "gpu_share.challenge.numpy_chain"
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "numpy" not in modules_loaded_by("import gpu_share.challenge.sizing")


# What the coordinator takes from the agent: the CatBoost train config contract alone, so an
# upload is checked exactly as the runtime will check it (docs/architecture.md).
AGENT_CONTRACT = ("gpu_share.agent.runtimes.catboost_config", "gpu_share.agent.runtimes.runner")


def test_the_coordinator_takes_from_the_agent_only_the_train_config_contract() -> None:
    used = {
        imp.imported
        for imp in IMPORTS
        if imp.importer.startswith("gpu_share.coordinator.")
        and imp.imported.startswith("gpu_share.agent")
    }
    assert used <= set(AGENT_CONTRACT), sorted(used - set(AGENT_CONTRACT))
    loaded = modules_loaded_by("import gpu_share.agent.runtimes.catboost_config")
    agent_weight = {*HEAVY, "numpy", "psutil", "pynvml", "docker", "websockets"}
    assert not loaded & agent_weight, sorted(loaded & agent_weight)


def test_cli_entry_point_imports_no_server() -> None:
    loaded = modules_loaded_by("import gpu_share.cli.main")
    assert not loaded & set(HEAVY)


def test_pages_and_the_api_share_request_helpers_only_through_http() -> None:
    assert not _offenders(
        "gpu_share.coordinator.web", ("gpu_share.coordinator.api",), top_only=False
    )
    assert not _offenders(
        "gpu_share.coordinator.api", ("gpu_share.coordinator.web",), top_only=False
    )


# The services' domains and the domains each may use. The arrows run one way (a test below
# sorts them); services/__init__.py and docs/architecture.md draw the same picture.
SERVICES = PACKAGE / "coordinator" / "services"
DOMAIN_USES: dict[str, set[str]] = {
    "accounts": {"mail"},  # a tenant application mails the link that confirms its email
    "mail": set(),
    "webhooks": set(),  # others emit events in their own transactions
    "artifacts": set(),
    "nodes": {"accounts"},
    "providers": {"nodes", "accounts", "mail"},
    "money": {"providers", "nodes", "mail", "webhooks"},
    "work": {"money", "nodes", "artifacts", "webhooks"},
    "rentals": {"work", "money", "nodes", "webhooks"},
    "sessions": {"work", "money", "nodes", "webhooks"},
    "market": {"work", "nodes"},
    "platform": {"nodes", "money"},  # /metrics reads the books' balances
    "trust": {"work", "money", "mail", "artifacts", "nodes"},
}


def _public_modules(domain: str) -> set[str]:
    """What a domain's `__init__` lists in `__all__`: the modules other domains may use."""
    tree = ast.parse((SERVICES / domain / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return set(ast.literal_eval(node.value))
    raise AssertionError(f"services/{domain}/__init__.py declares no __all__")


def _domain_of(module: str) -> tuple[str, str | None] | None:
    """(domain, module inside it) of a services module; None outside services/."""
    parts = module.split(".")
    if parts[:3] != ["gpu_share", "coordinator", "services"] or len(parts) < 4:
        return None
    return parts[3], (parts[4] if len(parts) > 4 else None)


def _cross_domain_imports() -> list[tuple[str, str, str, str | None]]:
    """(importer, its domain, the imported domain, the imported module) across domains."""
    found = []
    for imp in IMPORTS:
        here, there = _domain_of(imp.importer), _domain_of(imp.imported)
        if here is not None and there is not None and here[0] != there[0]:
            found.append((imp.importer, here[0], there[0], there[1]))
    return found


def test_services_are_one_package_per_domain_each_saying_what_it_owns() -> None:
    loose = sorted(p.name for p in SERVICES.glob("*.py"))
    assert loose == ["__init__.py"], f"services/ holds modules outside a domain: {loose}"
    domains = sorted(p.name for p in SERVICES.iterdir() if (p / "__init__.py").is_file())
    assert domains == sorted(DOMAIN_USES)
    for domain in domains:
        doc = ast.get_docstring(ast.parse((SERVICES / domain / "__init__.py").read_text()))
        assert doc, f"services/{domain}/__init__.py says nothing of what the domain owns"
        for public in _public_modules(domain):
            assert (SERVICES / domain / f"{public}.py").is_file(), f"{domain}.{public}"


def test_a_domain_uses_another_only_through_the_modules_it_makes_public() -> None:
    wrong = [
        f"{importer} uses {domain}.{module or '__init__'}, which {domain} does not make public"
        for importer, _, domain, module in _cross_domain_imports()
        if module not in _public_modules(domain)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_arrows_between_domains_are_the_ones_written_down() -> None:
    wrong = sorted(
        {
            f"{here} uses {there} ({importer})"
            for importer, here, there, _ in _cross_domain_imports()
            if there not in DOMAIN_USES[here]
        }
    )
    assert not wrong, "\n".join(wrong)


def test_the_arrows_between_domains_run_one_way() -> None:
    placed: list[str] = []
    left = dict(DOMAIN_USES)
    while left:
        ready = sorted(d for d, uses in left.items() if uses <= set(placed))
        assert ready, f"the domains {sorted(left)} use each other in a circle"
        placed.extend(ready)
        for domain in ready:
            del left[domain]


def test_the_domain_checks_see_the_arrows_that_exist() -> None:
    """The checks above would pass vacuously if no cross-domain import were seen."""
    arrows = {(here, there) for _, here, there, _ in _cross_domain_imports()}
    assert ("work", "money") in arrows and ("money", "nodes") in arrows


def test_the_agents_benchmarks_take_the_agent_as_an_argument() -> None:
    """They reach the coordinator through the `Uplink` they are handed, never by importing
    the agent that imports them."""
    allowed = ("gpu_share.agent.benchmarks", "gpu_share.protocol", "gpu_share.backoff")
    assert not [
        f"{imp.importer} imports {imp.imported}"
        for imp in IMPORTS
        if imp.importer.startswith("gpu_share.agent.benchmarks")
        and imp.imported.startswith("gpu_share.")
        and not any(imp.imported == a or imp.imported.startswith(a + ".") for a in allowed)
    ]
