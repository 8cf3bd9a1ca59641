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


SYS_CPUS = Path("/sys/devices/system/cpu")


def _cpu_list(text: str) -> list[int]:
    """A kernel CPU list ("0,8", "0-3,8-11") as its CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus += range(int(low), int(high) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


def physical_cores(cpus: list[int], root: Path = SYS_CPUS) -> list[list[int]]:
    """`cpus` grouped by the physical core they run on (a core's hardware threads together, in CPU order),
    from sysfs; a CPU whose topology cannot be read is a core of its own."""
    cores: dict[tuple[int, ...], list[int]] = {}
    allowed = set(cpus)
    for cpu in sorted(cpus):
        try:
            siblings = _cpu_list((root / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = [cpu]
        cores.setdefault(tuple(sorted(set(siblings) & allowed) or [cpu]), []).append(cpu)
    return sorted(cores.values())


def split_by_core(cpus: list[int], root: Path = SYS_CPUS) -> tuple[list[int], list[int]]:
    """Two halves of `cpus` that share no physical core (the first half's cores, the second's), as two hosts
    would not: a split by CPU number alone puts a core's two hardware threads on either side where the kernel
    numbers siblings n and n + cores (common on cloud machines), and the two sides then slow each other down.
    A single core is split by CPU (nothing better exists)."""
    cores = physical_cores(cpus, root)
    if len(cores) < 2:
        ordered = sorted(cpus)
        return ordered[: len(ordered) // 2], ordered[len(ordered) // 2 :]
    first = cores[: len(cores) // 2]
    return sorted(c for core in first for c in core), sorted(c for core in cores[len(cores) // 2 :] for c in core)
