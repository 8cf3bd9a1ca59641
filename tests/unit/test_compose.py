"""docker-compose.yml and its Prometheus and Grafana files agree with the
server's real flags, environment and metrics (no Docker engine needed)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from plancache_server import telemetry
from plancache_server.settings import SERVER, options, parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _service_flags() -> dict[str, str]:
    command = COMPOSE["services"]["plancache"]["command"]
    args = parser(SERVER).parse_args(command)  # exits on any flag the server does not have
    redis_url = COMPOSE["services"]["plancache"]["environment"]["PLANCACHE_REDIS_URL"]
    return {
        "listen": args.listen,
        "metrics": str(args.metrics_port),
        "redis": redis_url,
        "data": str(args.data_dir),
        "tokens": str(args.tokens_file),
        "signing_key": str(args.signing_key),
        "redis_password": str(args.redis_password_file),
    }


def _defaults(text: str) -> str:
    """Compose's interpolation with an empty environment: ${VAR:-default} -> default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def _published(service: str) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each port a service publishes, by default."""
    published = []
    for spec in COMPOSE["services"][service].get("ports", []):
        host, host_port, container_port = _defaults(str(spec)).rsplit(":", 2)
        published.append((host, int(host_port), int(container_port)))
    return published


def _secret_source(service: str, flag_value: str) -> dict[str, str]:
    """The top-level secret behind /run/secrets/NAME, which `service` must be given."""
    name = flag_value.removeprefix("/run/secrets/")
    assert name in COMPOSE["services"][service]["secrets"], name
    return dict(COMPOSE["secrets"][name])


def test_services_and_persistence() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"redis", "plancache", "prometheus", "grafana"}
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command
    assert any(v.startswith("redis-data:") for v in services["redis"]["volumes"])
    reservation = services["plancache"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert reservation["driver"] == "nvidia" and "gpu" in reservation["capabilities"]


def test_plancache_command_ports_and_environment_match_the_server() -> None:
    flags = _service_flags()
    published = {container for _, _, container in _published("plancache")}
    assert int(flags["listen"].rsplit(":", 1)[1]) in published and int(flags["metrics"]) in published
    known_env = {f"PLANCACHE_{option.env}" for _, option in options(SERVER)}
    assert set(COMPOSE["services"]["plancache"]["environment"]) <= known_env
    assert any(v.endswith(":" + flags["data"]) for v in COMPOSE["services"]["plancache"]["volumes"])


def test_every_port_is_published_on_localhost_by_default() -> None:
    """Nothing is reachable from another host until the operator says so (PLANCACHE_BIND, PLANCACHE_OPS_BIND)."""
    published = {service: _published(service) for service in COMPOSE["services"]}
    assert published["redis"] == []  # only the compose network reaches Redis
    every = [p for ports in published.values() for p in ports]
    assert {(host, port) for host, port, _ in every} == {
        ("127.0.0.1", 50051),
        ("127.0.0.1", 9464),
        ("127.0.0.1", 9090),
        ("127.0.0.1", 3000),
    }
    grpc_port = next(spec for spec in COMPOSE["services"]["plancache"]["ports"] if ":50051:" in spec)
    assert grpc_port.startswith("${PLANCACHE_BIND:-127.0.0.1}:")  # the documented override


def test_the_grpc_port_wants_a_token() -> None:
    """--tokens-file from a secret that docker/init-secrets.sh writes (a compile and an admin token)."""
    flags = _service_flags()
    assert _secret_source("plancache", flags["tokens"]) == {"file": "./secrets/tokens"}
    assert "secrets/tokens" in (ROOT / "docker" / "init-secrets.sh").read_text()


def test_the_public_key_is_published_for_clients() -> None:
    """Workers sign with a key made before the first start (init-secrets.sh); its public half stays on the host,
    beside it, for clients (docs/deploying.md), instead of inside a volume."""
    flags = _service_flags()
    source = _secret_source("plancache", flags["signing_key"])
    assert source == {"file": "./secrets/plan-signing.pem"}
    script = (ROOT / "docker" / "init-secrets.sh").read_text()
    assert "secrets/plan-signing.pub.pem" in script and "-pubout" in script
    assert "secrets/plan-signing.pub.pem" in (ROOT / "docs" / "deploying.md").read_text()


def test_the_redis_password_reaches_the_server_by_file_quoted() -> None:
    """No password in the URL (a '@', '/' or '#' in it would break the URL): a secret file, which the
    server quotes into its URL (plancache_server.settings.command_line.url_with_password)."""
    flags = _service_flags()
    assert flags["redis"] == "redis://redis:6379/0"
    assert _secret_source("plancache", flags["redis_password"]) == {"environment": "PLANCACHE_REDIS_PASSWORD"}
    assert "--requirepass" in " ".join(COMPOSE["services"]["redis"]["command"])
    assert "PLANCACHE_REDIS_PASSWORD" in COMPOSE["services"]["redis"]["environment"]["REDIS_PASSWORD"]
    assert not any("redis://" in part for part in COMPOSE["services"]["plancache"]["command"])


def test_a_password_with_any_character_is_quoted_into_the_url(tmp_path: Path) -> None:
    import redis

    from plancache_server.settings import server_settings

    password = 'p@ss:w/o#r?d%&x "y"'
    secret = tmp_path / "redis_password"
    secret.write_text(password + "\n")
    settings = server_settings(["--redis-url", "redis://redis:6379/0", "--redis-password-file", str(secret)])
    assert settings.redis_url is not None
    parsed = redis.connection.parse_url(settings.redis_url)
    assert (parsed["host"], parsed["port"], parsed["password"]) == ("redis", 6379, password)
    as_worker = server_settings(
        ["--redis-url", "redis://plancache-worker@h:6379/0", "--redis-password-file", str(secret)]
    )
    assert redis.connection.parse_url(as_worker.redis_url or "")["username"] == "plancache-worker"


def test_prometheus_scrapes_what_the_server_lists() -> None:
    """One target per worker that exists, from the server's HTTP service discovery (not 8 fixed ports)."""
    from plancache_server.web.http import SCRAPE_TARGETS_PATH

    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert "static_configs" not in job
    (sd,) = job["http_sd_configs"]
    assert sd["url"] == f"http://plancache:{_service_flags()['metrics']}{SCRAPE_TARGETS_PATH}"
    assert COMPOSE["services"]["prometheus"]["depends_on"]["plancache"] == {"condition": "service_healthy"}


def test_grafana_dashboard_queries_metrics_that_exist() -> None:
    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "plancache.json").read_text())
    exported = set()
    for metric in (
        telemetry.REQUESTS,
        telemetry.REQUEST_SECONDS,
        telemetry.LOOKUPS,
        telemetry.BUILDS,
        telemetry.BUILD_SECONDS,
        telemetry.BUSY,
        telemetry.FLEET_GRAPHS,
        telemetry.FLEET_RACES,
        telemetry.UNTRUSTED_BUILDS,
        telemetry.BUILD_INFO,
    ):
        name = metric._name
        exported |= {name, f"{name}_total", f"{name}_bucket"}
    exported |= {"plancache_jobs_waiting", "plancache_jobs_running", "plancache_live_workers"}
    used = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"plancache_[a-z_]+", t["expr"])}
    assert used and used <= exported, used - exported
    rules = yaml.safe_load((ROOT / "docker" / "prometheus-rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    in_rules = {m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"plancache[a-z_:0-9]+", r["expr"])}
    assert in_rules and in_rules <= exported | recorded, in_rules - exported - recorded
    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["prometheus-rules.yml"]
    mounted = COMPOSE["services"]["prometheus"]["volumes"]
    assert "./docker/prometheus-rules.yml:/etc/prometheus/prometheus-rules.yml:ro" in mounted
    datasources = yaml.safe_load(
        (ROOT / "docker" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"


def test_the_configuration_page_table_is_the_settings_table() -> None:
    """Every flag, its environment variable and default, from the one declaration of each setting."""
    from plancache_server.settings import markdown_table

    page = (ROOT / "docs" / "configuration.md").read_text()
    assert markdown_table() in page, "docs/configuration.md's flags table is stale: run scripts/sync-readme.py"
    rows = [line for line in page.split("\n") if line.startswith("| `--")]
    assert len(rows) == len(markdown_table().split("\n")) - 2, "the flags table has rows no setting declares"


def _acl_commands(page: str) -> dict[str, list[str]]:
    """The `redis-cli ACL SETUSER` commands of docs/operations.md, as the shell splits them."""
    block = page.split("<!-- generated from plancache_server.store.keys", 1)[1].split("<!-- /generated -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(c) for c in body.replace("\\\n", " ").split("\n") if c.strip()]
    return {words[3]: words for words in commands}


def test_the_documented_acl_commands_are_the_ones_tested() -> None:
    """docs/operations.md's ACL SETUSER commands, as a shell passes them to redis-cli, are keys.ACL_RULES
    (which test_redis_acl runs a gateway and a worker under), readable: no line over 100 characters."""
    from plancache_server.store import keys

    page = (ROOT / "docs" / "operations.md").read_text()
    commands = _acl_commands(page)
    for role, user in (("gateway", "plancache-gateway"), ("worker", "plancache-worker")):
        assert commands[user] == ["redis-cli", "ACL", "SETUSER", *keys.acl_setuser(role, user, f"<{role} password>")], (
            "docs/operations.md's ACL commands are stale: run scripts/sync-readme.py"
        )
    assert set(commands) == {"plancache-gateway", "plancache-worker"}
    acl_lines = page.split("<!-- generated from plancache_server.store.keys", 1)[1].split("<!-- /generated -->")[0]
    assert max(len(line) for line in acl_lines.split("\n")) <= 100


# ---- docker/Dockerfile and .dockerignore (parsed: no engine needed)

DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments left out."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#"))
    )
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.M)]


def _args() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in _dockerfile_instructions() if i == "ARG" and "=" in a)


def _newest_gpu_run_versions() -> dict[str, str]:
    """torch, cuDNN and frontend versions of the newest docs/gpu-runs record that names them."""
    for path in sorted((ROOT / "docs" / "gpu-runs").glob("*.md"), reverse=True):
        found = re.search(
            r"torch (\d+\.\d+\.\d+)\S*.*?cuDNN (\d+\.\d+\.\d+), frontend (\d+\.\d+\.\d+)", path.read_text(), re.S
        )
        if found:
            return {"torch": found.group(1), "cudnn": found.group(2), "frontend": found.group(3), "run": path.name}
    raise AssertionError("no GPU run names its torch, cuDNN and frontend versions")


def test_the_image_pins_what_the_newest_gpu_run_proved() -> None:
    args, run = _args(), _newest_gpu_run_versions()
    assert args["TORCH_VERSION"] == run["torch"], run
    assert args["CUDNN_VERSION"].startswith(run["cudnn"] + "."), run  # the wheel's 4-part version
    assert args["FRONTEND_VERSION"] == run["frontend"], run
    major, minor, patch = (int(x) for x in run["cudnn"].split("."))
    assert args["CUDNN_BACKEND"] == str(major * 10000 + minor * 100 + patch)  # as cudnn.backend_version() says
    install = next(a for i, a in _dockerfile_instructions() if i == "RUN" and "pip install" in a)
    for pin in (
        '"torch==${TORCH_VERSION}"',
        '"nvidia-cudnn-cu13==${CUDNN_VERSION}"',
        '"nvidia-cudnn-frontend==${FRONTEND_VERSION}"',
    ):
        assert pin in install
    (base,) = [a for i, a in _dockerfile_instructions() if i == "FROM"]
    assert base == "nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04"  # no second cuDNN from the base image
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["CUDA_VERSION"])


def test_the_labels_carry_the_versions_and_the_target_id() -> None:
    labels = " ".join(a for i, a in _dockerfile_instructions() if i == "LABEL")
    assert 'io.plancache.torch="${TORCH_VERSION}"' in labels
    assert 'io.plancache.cudnn="${CUDNN_VERSION}"' in labels
    assert 'io.plancache.cudnn-frontend="${FRONTEND_VERSION}"' in labels
    assert 'io.plancache.target-id="sm_<compute capability>/cudnn-${CUDNN_BACKEND}/fe-${FRONTEND_VERSION}"' in labels
    from plancache.keys.target import Target

    args = _args()
    assert Target("sm_90", int(args["CUDNN_BACKEND"]), args["FRONTEND_VERSION"]).id == (
        f"sm_90/cudnn-{args['CUDNN_BACKEND']}/fe-{args['FRONTEND_VERSION']}"
    )


def test_the_image_checks_its_health_on_the_grpc_health_service() -> None:
    (healthcheck,) = [a for i, a in _dockerfile_instructions() if i == "HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD")
    assert "--interval=" in options and "--start-period=" in options
    argv = json.loads(command)
    assert argv[:2] == ["python3", "-c"] and "grpc_health.v1" in argv[2] and "SERVING" in argv[2]
    exposed = {int(p) for i, a in _dockerfile_instructions() if i == "EXPOSE" for p in a.split()}
    assert exposed == {container for _, _, container in _published("plancache")}


def healthcheck_program() -> str:
    """The HEALTHCHECK's Python program (tests/integration/test_image_healthcheck.py runs it)."""
    (healthcheck,) = [a for i, a in _dockerfile_instructions() if i == "HEALTHCHECK"]
    return str(json.loads(healthcheck.partition("CMD")[2])[2])


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path (or a folder above it) decides; '!' keeps."""
    import fnmatch

    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        bare = pattern.removeprefix("!").rstrip("/")
        regex = fnmatch.translate(bare).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        if bare.startswith("**/"):
            regex = "(.*/)?" + fnmatch.translate(bare[3:]).replace(".*", "[^/]*")
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not keep
    return excluded


def test_the_build_context_is_only_what_the_image_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for left_out in (
        ".venv/lib/python3.12/site-packages/torch/__init__.py",
        ".git/objects/pack/x.pack",
        ".env",
        "secrets/tokens",
        "secrets/plan-signing.pem",
        "bench/results/herd.json",
        ".whl/torch-2.11.0-cp312.whl",
        ".frontend-suite/test_x.py",
        "tests/conformance/node/node_modules/x/index.js",
        "client/src/plancache/__pycache__/x.cpython-312.pyc",
        "server/.mypy_cache/x.json",
        "client/src/plancache.egg-info/PKG-INFO",
    ):
        assert _dockerignored(left_out, patterns), left_out
    copied = [a.split()[0] for i, a in _dockerfile_instructions() if i == "COPY"]
    assert copied == ["client/", "server/", "README.md"]
    for sent in (
        "client/pyproject.toml",
        "client/src/plancache/__init__.py",
        "server/src/plancache_server/main.py",
        "README.md",
    ):
        assert not _dockerignored(sent, patterns), sent


def test_init_secrets_makes_what_compose_reads_once(tmp_path: Path) -> None:
    import shutil
    import stat
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("no openssl here: docker/init-secrets.sh needs it")
    script = ROOT / "docker" / "init-secrets.sh"
    first = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, check=True)
    assert "plan-signing" in first.stdout
    from plancache.trust.signing import Signer, load_public_key
    from plancache_server.gateway.auth import Authorizer

    signer = Signer.from_file(tmp_path / "secrets" / "plan-signing.pem")
    published = tmp_path / "secrets" / "plan-signing.pub.pem"
    load_public_key(published)
    assert signer.public_pem().strip() == published.read_bytes().strip()  # the public half of the workers' key
    assert not Authorizer.from_file(tmp_path / "secrets" / "tokens").open
    for secret in ("plan-signing.pem", "tokens"):
        assert stat.S_IMODE((tmp_path / "secrets" / secret).stat().st_mode) == 0o600, secret
    env = (tmp_path / ".env").read_text()
    assert re.fullmatch(r"PLANCACHE_REDIS_PASSWORD=[0-9a-f]{48}\n", env)
    before = {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()}
    subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, check=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()} == before  # kept
    assert (tmp_path / ".env").read_text() == env


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    """`docker compose config` where a compose binary exists (it resolves and validates the whole file)."""
    import shutil
    import subprocess

    import pytest

    command: list[str] | None = None
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0
    ):
        command = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        command = ["docker-compose"]
    if command is None:
        pytest.skip("no docker compose binary here: the file is checked by parsing it (the tests above)")
    for name in ("docker-compose.yml", "docker"):
        target = tmp_path / name
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, target)
    subprocess.run(
        ["bash", str(tmp_path / "docker" / "init-secrets.sh"), str(tmp_path)], check=True, capture_output=True
    )
    run = subprocess.run([*command, "config", "--quiet"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
