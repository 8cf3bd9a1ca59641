"""What an operator sees of a fault: the lines the processes log, and the
figures a fault test prints (run with -s to see them)."""

from __future__ import annotations

import json
import re

TRACEBACK = "Traceback (most recent call last)"


def report(name: str, figures: dict[str, object]) -> None:
    print(f"\n[fault] {name}: {json.dumps(figures)}")


def lines_matching(log_text: str, pattern: str) -> list[str]:
    return [line for line in log_text.splitlines() if re.search(pattern, line)]


def assert_no_traceback(*log_texts: str) -> None:
    for text in log_texts:
        assert TRACEBACK not in text, text[-4000:]


# Every worker these tests start runs the stand-in compiler, and says so at start (worker_main): a warning a real
# deployment never shows, so not one of the fault's lines.
STANDIN_BANNER = "a STAND-IN COMPILER, not cuDNN"


def problem_lines(log_text: str) -> list[str]:
    """The WARNING and ERROR lines (the format of plancache_server.main.configure_logging), but the stand-in's banner."""
    return [line for line in lines_matching(log_text, r" (WARNING|ERROR) ") if STANDIN_BANNER not in line]
