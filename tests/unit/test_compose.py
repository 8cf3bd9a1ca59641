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
    return {"listen": args.listen, "metrics": str(args.metrics_port), "redis": redis_url, "data": str(args.data_dir)}


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
    # Redis has a password, and the server gets it by environment (argv is readable by any local user).
    assert flags["redis"].startswith("redis://:${PLANCACHE_REDIS_PASSWORD") and flags["redis"].endswith("@redis:6379/0")
    assert "--requirepass" in " ".join(COMPOSE["services"]["redis"]["command"])
    assert not any("redis://" in part for part in COMPOSE["services"]["plancache"]["command"])
    published = {p.split(":")[1] for p in COMPOSE["services"]["plancache"]["ports"]}
    assert flags["listen"].rsplit(":", 1)[1] in published and flags["metrics"] in published
    known_env = {f"PLANCACHE_{option.env}" for _, option in options(SERVER)}
    assert set(COMPOSE["services"]["plancache"]["environment"]) <= known_env
    assert any(v.endswith(":" + flags["data"]) for v in COMPOSE["services"]["plancache"]["volumes"])


def test_prometheus_scrapes_the_metrics_ports() -> None:
    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for group in job["static_configs"] for t in group["targets"]]
    port = int(_service_flags()["metrics"])
    assert f"plancache:{port}" in targets and f"plancache:{port + 1}" in targets  # gateway, first worker


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
