"""bench/startup.py --split-cpus: node and service get whole physical cores, never two threads of one core."""

from __future__ import annotations

from pathlib import Path

from bench.procs import physical_cores, split_by_core


def sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(text + "\n")
    return root


def test_threads_numbered_n_and_n_plus_cores_are_split_by_core(tmp_path: Path) -> None:
    # 4 cores, 2 threads each, numbered as many cloud machines do: core k has CPUs k and k + 4.
    root = sysfs(tmp_path, {cpu: f"{cpu % 4},{cpu % 4 + 4}" for cpu in range(8)})
    assert physical_cores(list(range(8)), root) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    node, service = split_by_core(list(range(8)), root)
    assert (node, service) == ([0, 1, 4, 5], [2, 3, 6, 7])  # the old split, 0-3 / 4-7, put every core on both sides


def test_adjacent_threads_and_ranges(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {cpu: f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}" for cpu in range(8)})
    assert split_by_core(list(range(8)), root) == ([0, 1, 2, 3], [4, 5, 6, 7])


def test_only_the_allowed_cpus_count(tmp_path: Path) -> None:
    # The process may run on 2, 3, 6, 7 only (an affinity mask): their cores are [2, 6] and [3, 7].
    root = sysfs(tmp_path, {cpu: f"{cpu % 4},{cpu % 4 + 4}" for cpu in range(8)})
    assert split_by_core([2, 3, 6, 7], root) == ([2, 6], [3, 7])


def test_unreadable_topology_falls_back_to_one_cpu_per_core(tmp_path: Path) -> None:
    assert physical_cores([0, 1, 2, 3], tmp_path / "missing") == [[0], [1], [2], [3]]
    assert split_by_core([0, 1, 2, 3], tmp_path / "missing") == ([0, 1], [2, 3])


def test_one_core_is_split_by_cpu(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {0: "0-1", 1: "0-1"})
    assert split_by_core([0, 1], root) == ([0], [1])
