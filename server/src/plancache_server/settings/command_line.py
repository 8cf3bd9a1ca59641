"""What the declarations give: the programs' argument parsers (the environment as their defaults), the Settings
they parse to, the flags a server hands its workers and the configuration table of docs/configuration.md."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from dataclasses import fields, replace
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from plancache.env import env_bool
from plancache.errors import InvalidRequest
from plancache.versions import add_version
from plancache_server.settings.declare import SERVER, WORKER, Option
from plancache_server.settings.groups import HEDGED_HOLD_MAX_LIMIT_S, Settings


def options(program: str | None = None) -> Iterator[tuple[str, Option]]:
    """(field name, option) of every setting a program takes (None: all)."""
    for f in fields(Settings):
        option = f.metadata.get("option")
        if option is not None and (program is None or program in option.programs):
            yield f.name, option


def parser(program: str) -> argparse.ArgumentParser:
    description = {
        SERVER: "Serve autotuned cuDNN plans over gRPC.",
        WORKER: "Build and autotune plans on local GPUs for a plancache deployment.",
    }
    p = argparse.ArgumentParser(prog=f"plancache-{program}", description=description[program])
    add_version(p, f"plancache-{program}", "plancache-server", stack=True)
    defaults = Settings()
    for name, option in options(program):
        env = os.environ.get(f"PLANCACHE_{option.env}")
        help_text = f"{option.help} (env PLANCACHE_{option.env}" + (
            f"; default {option.shown_default})" if option.shown_default else ")"
        )
        if option.is_switch:
            try:  # plancache.env's words: PLANCACHE_UNSIGNED=true is on, =maybe a start-up error
                default = env_bool(f"PLANCACHE_{option.env}", getattr(defaults, name))
            except InvalidRequest as e:
                p.error(f"{e.message} (the environment's {option.flag})")
            p.add_argument(option.flag, dest=name, action="store_true", default=default, help=help_text)
        else:
            try:
                default = option.parse(env) if env is not None else getattr(defaults, name)
            except (ValueError, argparse.ArgumentTypeError) as e:
                p.error(f"PLANCACHE_{option.env}={env!r} (the environment's {option.flag}): {e}")
            p.add_argument(option.flag, dest=name, type=option.parse, default=default, help=help_text)
    if program == WORKER:
        p.add_argument(
            "--device", type=int, action="append", help="GPU index (repeat for several; default: every visible GPU)"
        )
    return p


def url_with_password(url: str, password: str) -> str:
    """`url` with `password` as its user's password, percent-quoted (a password may hold @ : / # ? %)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "password"] + [("password", password)]
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query, quote_via=quote)}"
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0].partition(":")[0] if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


def _with_redis_password(settings: Settings) -> Settings:
    if settings.redis_password_file is None:
        return settings
    if not settings.redis_url:
        raise SystemExit("--redis-password-file is the password of --redis-url's user: give --redis-url too")
    try:
        password = settings.redis_password_file.read_text().rstrip("\r\n")
    except OSError as e:
        raise SystemExit(f"--redis-password-file {settings.redis_password_file}: {e.strerror or e}") from None
    return replace(settings, redis_url=url_with_password(settings.redis_url, password))


def settings_from(args: argparse.Namespace, program: str) -> Settings:
    values = {name: getattr(args, name) for name, _ in options(program)}
    settings = _with_redis_password(Settings(**values))
    if (
        settings.claim_idle_s < 2 * settings.heartbeat_interval_s
        or settings.heartbeat_ttl_s < 2 * settings.heartbeat_interval_s
    ):
        raise SystemExit(
            "--claim-idle and --heartbeat-ttl must be at least twice --heartbeat-interval "
            "(a live worker would look dead)"
        )
    if settings.signing_key is not None and settings.unsigned:
        raise SystemExit("--signing-key and --unsigned exclude each other")
    if settings.store_replicas < 0 or settings.store_replicas_wait_ms < 1:
        raise SystemExit("--store-replicas must be 0 or more and --store-replicas-wait-ms at least 1")
    if not 0 <= settings.hedged_hold_max_s <= HEDGED_HOLD_MAX_LIMIT_S:
        raise SystemExit(f"--hedged-hold-max must be 0 to {HEDGED_HOLD_MAX_LIMIT_S:g} seconds")
    if settings.event_loop not in ("auto", "uvloop", "asyncio"):
        raise SystemExit(f"--event-loop must be auto, uvloop or asyncio, not {settings.event_loop!r}")
    return settings


def server_settings(argv: Sequence[str] | None = None) -> Settings:
    return settings_from(parser(SERVER).parse_args(argv), SERVER)


def worker_flags(settings: Settings) -> list[str]:
    """Flags that hand these settings on to a `plancache-worker` child."""
    flags: list[str] = []
    for name, option in options(WORKER):
        value = getattr(settings, name)
        if not option.to_workers or value is None or value is False:
            continue
        flags += [option.flag] if option.is_switch else [option.flag, str(value)]
    if settings.metrics_port:
        flags += ["--metrics-port", str(settings.metrics_port + 1)]  # a worker adds its device index
    return flags


def markdown_table() -> str:
    """The flags table of docs/configuration.md (kept equal to it by a test)."""
    rows = ["| flag | environment | default | programs | meaning |", "|---|---|---|---|---|"]
    for _, option in options():
        shown = option.shown_default
        default = f"`{shown}`" if shown and " " not in shown else shown or "—"
        meaning = option.help.replace("|", "\\|")
        programs = ", ".join(sorted(option.programs))
        rows.append(f"| `{option.flag}` | `PLANCACHE_{option.env}` | {default} | {programs} | {meaning} |")
    return "\n".join(rows)
