"""What a benchmark reads of the processes it starts (Linux /proc): children, CPU time."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children(p)]
        found += below
        frontier = below
    return found


def cpu_seconds(pid: int) -> float:
    """User and system CPU a live process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """A process's CPU and its live descendants' (a worker's build processes)."""
    return sum(cpu_seconds(p) for p in [pid, *descendants(pid)])
