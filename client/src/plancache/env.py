"""Boolean environment variables, read one way on both sides (PLANCACHE_HEDGE, PLANCACHE_REPORT,
PLANCACHE_ALLOW_UNSIGNED, a server's switches such as PLANCACHE_UNSIGNED, ...).

1/0, true/false, yes/no and on/off, in any case, are the words taken; a variable that is unset or empty
keeps its default; anything else is refused (InvalidRequest naming the variable and its value; a server's
start-up error says the same), never read silently as off, as `PLANCACHE_UNSIGNED=true` once was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from plancache.errors import InvalidRequest

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(text: str, name: str) -> bool:
    """`text` as a boolean; InvalidRequest naming `name` (the variable, or a flag) otherwise."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise InvalidRequest(f"{name}={text!r} is not a boolean: write 1/0, true/false, yes/no or on/off")


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The boolean variable `name` (default when unset or empty); InvalidRequest for any other word."""
    text = (os.environ if environ is None else environ).get(name, "")
    return default if not text.strip() else parse_bool(text, name)
