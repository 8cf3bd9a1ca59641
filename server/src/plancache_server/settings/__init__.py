"""Configuration: one frozen object; each setting declared once.

A setting is a dataclass field whose metadata names its flag, its
environment variable (PLANCACHE_<NAME>), its help and which programs take it
(`plancache-server`, `plancache-worker`, or both). The argument parsers, the
environment reader, the flags a server hands to the workers it starts and
the table in docs/configuration.md all come from these declarations. Flags
win over the environment, the environment over the defaults. How a setting
is declared (declare), the settings grouped by concern (groups), what the
declarations give (command_line).

Owns: the settings' declarations and everything read from them (flags, environment, defaults, the docs' table).
May import: plancache.errors, plancache.graphspec, plancache.trust, plancache.addresses, plancache.env,
plancache.versions, plancache_server.settings.
"""

from plancache_server.settings.command_line import (
    markdown_table,
    options,
    parser,
    server_settings,
    settings_from,
    worker_flags,
)
from plancache_server.settings.declare import AUTOTUNE_STRATEGIES, BOTH, SERVER, WORKER, Option, default_data_dir
from plancache_server.settings.groups import Settings

__all__ = [
    "AUTOTUNE_STRATEGIES",
    "BOTH",
    "SERVER",
    "WORKER",
    "Option",
    "Settings",
    "default_data_dir",
    "markdown_table",
    "options",
    "parser",
    "server_settings",
    "settings_from",
    "worker_flags",
]
