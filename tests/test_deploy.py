"""The production deployment files, checked without Docker or a cluster (CI has neither):

- every manifest in deploy/kubernetes validates against Kubernetes' own schemas (strict:
  a misspelled field fails), and its parts fit together (selectors, names, probes);
- both compose files parse, and the production one runs its coordinators on PostgreSQL
  and S3 behind the proxy, which alone publishes the coordinators' port, while nothing
  publishes a relay port;
- every `GPUSHARE_*` variable these files name is a real setting, and the settings they
  give are accepted by the coordinator's `Settings`;
- deploy/production/nginx.conf routes to the coordinators' public port only, upgrades the
  agents' WebSocket, waits longer than the 60 s long-polls and streams uploads.
"""

import ipaddress
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from gpu_share.agent.settings import AgentSettings
from gpu_share.coordinator.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ROOT / "deploy/production"
COMPOSE = PRODUCTION / "compose.yaml"
NGINX_CONF = PRODUCTION / "nginx.conf"
KUBERNETES = ROOT / "deploy/kubernetes"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"  # the oldest schemas kubernetes-validate>=1.30 ships
COORDINATOR_IMAGE = "gpu-share-coordinator:latest"
PUBLIC_PORT = 8080
SAMPLE_ADMIN_KEY = "gpu_admin_" + "x" * 32


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifests() -> list[tuple[str, int, dict[str, Any]]]:
    return [(m.name, n, doc) for m in MANIFESTS for n, doc in enumerate(documents(m))]


def manifest(kind: str, name: str = "gpu-share-coordinator") -> dict[str, Any]:
    found = [
        doc for _, _, doc in manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} manifests"
    return found[0]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def coordinators() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose()["services"]
    return {
        name: service
        for name, service in services.items()
        if service.get("image") == COORDINATOR_IMAGE
    }


def interpolated(value: object) -> str | None:
    """A compose value as the container gets it with no variable set in the shell: the
    default of `${VAR:-default}`, a sample for a required `${VAR:?…}`; None for unset."""
    if value is None:
        return None
    text = str(value)
    text = re.sub(r"\$\{GPUSHARE_ADMIN_KEY:\?[^}]*\}", SAMPLE_ADMIN_KEY, text)
    assert ":?" not in text, f"a required variable with no sample here: {text}"
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def settings_from(env: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in env.items():
        if name.startswith("GPUSHARE_") and value is not None:
            monkeypatch.setenv(name, value)
    return Settings()


def published_container_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).rsplit(":", 1)[-1].split("/")[0]))
    return ports


# Kubernetes


def test_kubernetes_has_the_manifests_of_a_coordinator() -> None:
    kinds = sorted(doc["kind"] for _, _, doc in manifests())
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Namespace",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
    ]


@pytest.mark.parametrize(
    "document",
    [doc for _, _, doc in manifests()],
    ids=[f"{name}#{n}" for name, n, _ in manifests()],
)
def test_kubernetes_manifest_is_valid(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_kubernetes_validation_is_strict() -> None:
    service = manifest("Service")
    misspelled = {**service, "spec": {**service["spec"], "selectr": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelled, KUBERNETES_VERSION, strict=True)


def test_kubernetes_manifests_share_the_namespace() -> None:
    namespace = manifest("Namespace", "gpu-share")["metadata"]["name"]
    for name, _, doc in manifests():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, name


def test_kubernetes_selectors_match_the_coordinator_pods() -> None:
    deployment = manifest("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert manifest("Service")["spec"]["selector"].items() <= labels.items()
    assert manifest("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    policy = manifest("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == labels
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    assert {"podSelector": {"matchLabels": labels}} in peers


def test_kubernetes_coordinators_run_several_workers_with_relay_ports_of_their_own() -> None:
    spec = manifest("Deployment")["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == COORDINATOR_IMAGE
    command = container["command"]
    assert command[:2] == ["gpu-share", "server"]
    assert int(command[command.index("--workers") + 1]) > 1
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUSHARE_RELAY_HOST"]["value"] == "0.0.0.0"
    advertised = env["GPUSHARE_RELAY_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]
    assert advertised["fieldPath"] == "status.podIP"
    # Several workers in one pod cannot share one fixed relay port.
    assert "GPUSHARE_RELAY_PORT" not in env
    assert "GPUSHARE_RELAY_PORT" not in manifest("ConfigMap")["data"]
    assert "GPUSHARE_RELAY_PORT" not in manifest("Secret")["stringData"]
    assert pod["terminationGracePeriodSeconds"] >= 60


def test_kubernetes_coordinator_reads_the_configmap_and_secret() -> None:
    (container,) = manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    sources = {(key, source[key]["name"]) for source in container["envFrom"] for key in source}
    config = manifest("ConfigMap")["metadata"]["name"]
    secret = manifest("Secret")["metadata"]["name"]
    assert sources == {("configMapRef", config), ("secretRef", secret)}
    secret_keys = set(manifest("Secret")["stringData"])
    assert {"GPUSHARE_DATABASE_URL", "GPUSHARE_ADMIN_KEY", "GPUSHARE_METRICS_TOKEN"} <= (
        secret_keys
    )
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= secret_keys
    assert not secret_keys & set(manifest("ConfigMap")["data"])


def test_kubernetes_probes_and_service_use_the_public_port_only() -> None:
    (container,) = manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", PUBLIC_PORT)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert {"readinessProbe", "livenessProbe"} <= set(container)
    (service_port,) = manifest("Service")["spec"]["ports"]
    assert service_port["port"] == PUBLIC_PORT
    assert service_port["targetPort"] in ("http", PUBLIC_PORT)
    assert manifest("Service")["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_kubernetes_coordinator_runs_as_the_image_user_on_a_read_only_root() -> None:
    pod = manifest("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    writable = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert {"/tmp", "/var/lib/gpu-share"} <= set(writable)
    empty_dirs = {volume["name"] for volume in pod["volumes"] if "emptyDir" in volume}
    assert set(writable.values()) <= empty_dirs
    assert {"requests", "limits"} <= set(container["resources"])


def test_kubernetes_relay_traffic_is_allowed_between_coordinators_only() -> None:
    policy = manifest("NetworkPolicy")
    labels = policy["spec"]["podSelector"]["matchLabels"]
    for rule in policy["spec"]["ingress"]:
        any_port = any("port" not in port for port in rule["ports"])
        if any_port:
            assert rule["from"] == [{"podSelector": {"matchLabels": labels}}]
        else:
            assert [port["port"] for port in rule["ports"]] == [PUBLIC_PORT]


def test_kubernetes_settings_are_accepted_by_the_coordinator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (container,) = manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    env: dict[str, str | None] = {
        **manifest("ConfigMap")["data"],
        **manifest("Secret")["stringData"],
    }
    for entry in container["env"]:
        env[entry["name"]] = entry.get("value", "10.0.0.7")  # valueFrom: the pod's IP
    settings = settings_from(env, monkeypatch)
    assert settings.database_url.startswith("postgresql+asyncpg://")
    assert settings.storage == "s3"
    assert settings.relay_port == 0
    assert settings.log_format == "json"


# Compose


@pytest.mark.parametrize("path", [ROOT / "compose.yaml", COMPOSE], ids=lambda p: str(p))
def test_compose_file_parses(path: Path) -> None:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    assert loaded["services"]


def test_production_compose_runs_two_coordinators_on_postgres_and_s3(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = compose()["services"]
    found = coordinators()
    assert sorted(found) == ["coordinator-1", "coordinator-2"]
    for name, service in found.items():
        assert (
            COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]
        ).is_file()
        env = {key: interpolated(value) for key, value in service["environment"].items()}
        url = env["GPUSHARE_DATABASE_URL"]
        assert url is not None
        assert url.startswith("postgresql+asyncpg://")
        assert url.split("@", 1)[1].split(":")[0] in services
        assert env["GPUSHARE_STORAGE"] == "s3"
        assert env["GPUSHARE_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["GPUSHARE_S3_PUBLIC_ENDPOINT_URL"]
        assert env["GPUSHARE_RELAY_ADVERTISE_HOST"] == name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["depends_on"]["minio-init"]["condition"] == (
            "service_completed_successfully"
        )
        with monkeypatch.context() as scoped:
            settings = settings_from(env, scoped)
        assert settings.storage == "s3"
        assert settings.s3_bucket
        assert settings.log_format == "json"


def test_production_compose_gives_each_worker_a_relay_port_of_its_own() -> None:
    for name, service in coordinators().items():
        command = service["command"]
        workers = int(command[command.index("--workers") + 1]) if "--workers" in command else 1
        assert workers > 1, name
        # A fixed port would be bound by the first worker and refused to the second.
        assert "GPUSHARE_RELAY_PORT" not in service["environment"], name


def test_production_compose_publishes_the_coordinators_through_the_proxy_only() -> None:
    services = compose()["services"]
    publishing = {
        name
        for name, service in services.items()
        if PUBLIC_PORT in published_container_ports(service)
    }
    assert publishing == {"proxy"}
    for name, service in coordinators().items():
        assert "ports" not in service, f"{name} publishes ports"
        assert "expose" not in service, name
        relay_port = service["environment"].get("GPUSHARE_RELAY_PORT")
        for other in services.values():
            assert relay_port is None or int(relay_port) not in published_container_ports(other)
    proxy = services["proxy"]
    assert proxy["image"].partition(":")[0] == "nginx"
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in proxy["volumes"]}
    assert (COMPOSE.parent / mounts["/etc/nginx/nginx.conf"]).resolve() == NGINX_CONF


def test_production_compose_trusts_the_proxy_and_nothing_else() -> None:
    loaded = compose()
    (pool,) = loaded["networks"]["default"]["ipam"]["config"]
    subnet = ipaddress.ip_network(pool["subnet"])
    fixed = {
        name: ipaddress.ip_address(service["networks"]["default"]["ipv4_address"])
        for name, service in loaded["services"].items()
        if isinstance(service.get("networks"), dict)
    }
    assert all(address in subnet for address in fixed.values())
    # Fixed addresses stay out of the range others get theirs from.
    dynamic = ipaddress.ip_network(pool["ip_range"])
    assert not any(address in dynamic for address in fixed.values())
    for name, service in coordinators().items():
        trusted = [
            ipaddress.ip_network(entry.strip())
            for entry in service["environment"]["GPUSHARE_TRUSTED_PROXIES"].split(",")
        ]
        believed = {
            other for other, address in fixed.items() if any(address in net for net in trusted)
        }
        assert believed == {"proxy"}, name


def test_production_compose_pins_its_images_and_restarts_its_services() -> None:
    for name, service in compose()["services"].items():
        if "build" in service:
            continue
        image, _, tag = service["image"].partition(":")
        assert re.search(r"\d", tag) and "latest" not in tag, f"{name}: {image} is not pinned"
        assert service.get("restart") in ("unless-stopped", "no"), name


def test_production_compose_creates_the_bucket_the_coordinators_use() -> None:
    services = compose()["services"]
    init = services["minio-init"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    script = "\n".join(init["command"])
    assert re.search(r"mc mb --ignore-existing \"store/\$\$BUCKET\"", script)
    bucket = interpolated(init["environment"]["BUCKET"])
    for service in coordinators().values():
        assert interpolated(service["environment"]["GPUSHARE_S3_BUCKET"]) == bucket
        assert interpolated(service["environment"]["AWS_ACCESS_KEY_ID"]) == interpolated(
            services["minio"]["environment"]["MINIO_ROOT_USER"]
        )
        assert interpolated(service["environment"]["AWS_SECRET_ACCESS_KEY"]) == interpolated(
            services["minio"]["environment"]["MINIO_ROOT_PASSWORD"]
        )


def test_production_compose_commented_agent_reaches_the_proxy() -> None:
    block = re.search(r"^  # agent:\n(?:  #.*\n)+", COMPOSE.read_text(), re.MULTILINE)
    assert block
    uncommented = re.sub(r"^  # ?", "  ", block.group(0), flags=re.MULTILINE)
    agent = yaml.safe_load("services:\n" + uncommented)["services"]["agent"]
    assert agent["environment"]["GPUSHARE_AGENT_SERVER"] == f"http://proxy:{PUBLIC_PORT}"
    assert (COMPOSE.parent / agent["build"]["context"] / agent["build"]["dockerfile"]).is_file()


# Variables named anywhere in these files


NAMED_IN = [COMPOSE, *MANIFESTS, KUBERNETES / "README.md", ROOT / "docs/deployment.md"]


@pytest.mark.parametrize("path", NAMED_IN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_gpushare_variable_named_is_a_setting(path: Path) -> None:
    coordinator = {f"GPUSHARE_{name.upper()}" for name in Settings.model_fields}
    agent = {f"GPUSHARE_AGENT_{name.upper()}" for name in AgentSettings.model_fields}
    named = set(re.findall(r"GPUSHARE_[A-Z0-9_]+\b(?![*…])", path.read_text()))
    unknown = named - coordinator - agent
    assert not unknown, f"{path.name} names no such setting: {sorted(unknown)}"


# nginx


def nginx_conf() -> str:
    return re.sub(r"#[^\n]*", "", NGINX_CONF.read_text())


def block(text: str, opening: str) -> str:
    """The body of the block that `opening` (a regex) starts, braces balanced."""
    match = re.search(opening + r"\s*\{", text)
    assert match, f"no block {opening}"
    depth, start = 1, match.end()
    for at in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[start:at]
    raise AssertionError(f"block {opening} is not closed")


def seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[unit]


def test_nginx_routes_to_the_coordinators_public_port_only() -> None:
    upstream = block(nginx_conf(), r"upstream\s+coordinators")
    servers = re.findall(r"^\s*server\s+([^\s;]+)", upstream, re.MULTILINE)
    assert sorted(servers) == [f"{name}:{PUBLIC_PORT}" for name in sorted(coordinators())]
    assert not re.search(r"\b(ip_hash|hash|sticky)\b", upstream)  # no affinity needed
    passes = re.findall(r"proxy_pass\s+([^;]+);", nginx_conf())
    assert passes and set(passes) == {"http://coordinators"}


def test_nginx_upgrades_the_agents_websocket() -> None:
    text = nginx_conf()
    websocket = block(text, r"location\s+=\s+/v1/agent/sessions/ws")
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade;", websocket)
    assert re.search(r"proxy_set_header\s+Connection\s+\$connection_upgrade;", websocket)
    assert re.search(
        r"map\s+\$http_upgrade\s+\$connection_upgrade\s*\{[^}]*default\s+upgrade;", text
    )
    http_version = re.findall(r"proxy_http_version\s+([\d.]+);", text)
    assert http_version == ["1.1"]


def test_nginx_waits_longer_than_the_long_polls() -> None:
    timeouts = re.findall(r"proxy_read_timeout\s+(\w+);", nginx_conf())
    assert timeouts
    assert all(seconds(value) > 60 for value in timeouts), timeouts


def test_nginx_streams_large_uploads_and_downloads() -> None:
    text = nginx_conf()
    assert re.search(r"proxy_request_buffering\s+off;", text)
    assert re.search(r"proxy_buffering\s+off;", text)
    (size,) = re.findall(r"client_max_body_size\s+(\d+)([kKmMgG]?);", text)
    factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[size[1].lower()]
    assert int(size[0]) * factor >= 600 << 20


def test_nginx_passes_host_and_appends_the_client_address_in_every_location() -> None:
    text = nginx_conf()
    locations = re.findall(r"location\s+[^{]+", text)
    assert len(locations) == 2
    for opening in locations:
        body = block(text, re.escape(opening.strip()))
        # A location that sets any header inherits none from above.
        assert re.search(r"proxy_set_header\s+X-Forwarded-For\s+\$proxy_add_x_forwarded_for;", body)
        assert re.search(r"proxy_set_header\s+Host\s+\$(http_)?host;", body), opening
