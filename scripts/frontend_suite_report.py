"""What scripts/frontend_suite.py makes of a run: each test's outcome per phase
(pytest's junit XML, and the events of scripts/frontend_suite_plugin.py for
what the XML lacks), the tests whose outcome differs between the native run
and a plancache one, and the graphs plancache served or left to a local
build, per frontend node type. Pure functions of the files a run leaves.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("native", "plancache", "again")
PLANCACHE_PHASES = ("plancache", "again")
NOT_RUN = "not run"
# Outcomes of a run cut short (the phase's time limit): not a difference, "incomplete".
CUT = {NOT_RUN, "timeout"}
# Worst first: a test that failed its call and errored in teardown is "failed".
RANK = ("crashed", "timeout", "failed", "error", "xpassed", "xfailed", "skipped", "passed", NOT_RUN)


@dataclass(frozen=True)
class Outcome:
    outcome: str  # one of RANK
    message: str = ""  # a skip's reason, a failure's E line


def _worse(a: Outcome | None, b: Outcome) -> Outcome:
    return b if a is None or RANK.index(b.outcome) < RANK.index(a.outcome) else a


def junit_id(nodeid: str) -> tuple[str, str]:
    """(classname, name) of a nodeid in pytest's junit XML (its mangle_test_address)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def guess_nodeid(classname: str, name: str) -> str:
    """A nodeid for a junit case no event named (the test files are top-level modules)."""
    if not classname:
        return f"{name}.py"  # a module that failed to collect
    module, *rest = classname.split(".")
    return "::".join([f"{module}.py", *rest, name])


def parse_junit(text: str) -> dict[tuple[str, str], Outcome]:
    """Each testcase of pytest's junit XML: its outcome and message."""
    result: dict[tuple[str, str], Outcome] = {}
    for case in ET.fromstring(text).iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        children = {child.tag: child for child in case}
        if "failure" in children:
            outcome = Outcome("failed", children["failure"].get("message", ""))
        elif "error" in children:
            outcome = Outcome("error", children["error"].get("message", ""))
        elif "skipped" in children:
            skipped = children["skipped"]
            outcome = Outcome(
                "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped", skipped.get("message", "")
            )
        else:
            outcome = Outcome("passed")
        result[key] = _worse(result.get(key), Outcome(outcome.outcome, outcome.message[:400]))
    return result


def read_events(path: Path) -> list[dict[str, Any]]:
    """The plugin's JSON lines (a last line cut by a kill is dropped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _fold(reports: list[dict[str, Any]]) -> Outcome | None:
    """One test's outcome from its setup/call/teardown reports, as pytest counts it."""
    outcome: Outcome | None = None
    for r in reports:
        when, result, message = r.get("when"), r.get("outcome"), r.get("message", "")
        if "wasxfail" in r:
            outcome = Outcome({"skipped": "xfailed", "passed": "xpassed"}.get(str(result), "failed"), r["wasxfail"])
        elif result == "failed":
            if when == "call":
                outcome = Outcome("failed", message)
            elif outcome is None or outcome.outcome == "passed":
                outcome = Outcome("error", f"{when}: {message}")
        elif result == "skipped":
            outcome = Outcome("skipped", message)
        elif result == "passed" and when == "call":
            outcome = Outcome("passed")
    return outcome


def outcomes_from_events(events: list[dict[str, Any]], timed_out: bool = False) -> dict[str, Outcome]:
    """Outcomes from the plugin's events; a test that started and has no outcome
    was running when the process ended: "timeout" when the phase was cut at its
    limit (the last one started), "crashed" otherwise."""
    reports: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, Outcome] = {}
    for event in events:
        kind, nodeid = event.get("e"), event.get("nodeid", "")
        if kind == "start":
            reports.setdefault(nodeid, [])
        elif kind == "report":
            reports.setdefault(nodeid, []).append(event)
        elif kind == "collect_error":
            errors[nodeid] = Outcome("error", f"collection: {event.get('message', '')}")
    last = next(reversed(reports), None)
    result = dict(errors)
    for nodeid, its in reports.items():
        result[nodeid] = _fold(its) or Outcome(
            "timeout" if timed_out and nodeid == last else "crashed", "no outcome: the process ended during this test"
        )
    return result


def phase_outcomes(junit: str | None, events: list[dict[str, Any]], timed_out: bool = False) -> dict[str, Outcome]:
    """pytest's junit XML where it was written (the process ended on its own, or
    on SIGINT), the plugin's events for what it lacks (a test in progress at a
    kill, every test after a crash)."""
    from_events = outcomes_from_events(events, timed_out)
    if junit is None:
        return from_events
    nodeids = {junit_id(n): n for n in from_events}
    result = {nodeids.get(key) or guess_nodeid(*key): outcome for key, outcome in parse_junit(junit).items()}
    for nodeid, outcome in from_events.items():
        result.setdefault(nodeid, outcome)
    return result


def graphs_by_test(events: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """The graphs recorded per test (or "(between tests)"), and how many were lost (over 256 in one test)."""
    graphs: dict[str, list[dict[str, Any]]] = {}
    lost = 0
    for event in events:
        if event.get("e") == "graphs":
            graphs.setdefault(event["nodeid"], []).extend(event.get("graphs", []))
            lost += int(event.get("lost", 0))
    return graphs, lost


# ---- the comparison and the counts -----------------------------------------------------------------


def compare(
    first: Mapping[str, Outcome], second: Mapping[str, Outcome], names: tuple[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """Tests whose outcome differs; tests one side did not finish (its phase's
    time limit came first: not a difference, listed apart); tests skipped on
    both sides for other reasons."""
    differences, incomplete, reasons = [], [], []
    for nodeid in sorted(set(first) | set(second)):
        a, b = first.get(nodeid, Outcome(NOT_RUN)), second.get(nodeid, Outcome(NOT_RUN))
        row = {"nodeid": nodeid, names[0]: asdict(a), names[1]: asdict(b)}
        if {a.outcome, b.outcome} & CUT:
            if a.outcome != b.outcome:
                incomplete.append(row)
        elif a.outcome != b.outcome:
            differences.append(row)
        elif a.outcome == "skipped" and a.message != b.message:
            reasons.append(row)
    return {"differences": differences, "incomplete": incomplete, "other_skip_reason": reasons}


def is_served(graph: Mapping[str, Any]) -> bool:
    return graph.get("source") != "local"


def is_unbuildable(graph: Mapping[str, Any]) -> bool:
    """Built locally, and the frontend's own build failed too: not a graph the frontend builds."""
    return not is_served(graph) and graph.get("local_built") is False


def graph_summary(graphs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Graphs total, served, local; of those the frontend itself builds (a
    graph whose local build fails too is left out of that share); per node
    type (a graph counts once for each distinct node type it holds); why
    local; the plans' sources."""
    every = [g for gs in graphs.values() for g in gs]
    served = sum(1 for g in every if is_served(g))
    unbuildable = sum(1 for g in every if is_unbuildable(g))
    buildable = len(every) - unbuildable
    by_type: dict[str, dict[str, int]] = {}
    for g in every:
        for node_type in sorted(set(g.get("node_types") or ())) or ["(node types unknown)"]:
            row = by_type.setdefault(node_type, {"graphs": 0, "served": 0, "local": 0, "unbuildable": 0})
            row["graphs"] += 1
            row["served" if is_served(g) else "local"] += 1
            row["unbuildable"] += int(is_unbuildable(g))
    reasons = Counter(str(g.get("reason") or "?") for g in every if not is_served(g) and not is_unbuildable(g))
    return {
        "total": len(every),
        "served": served,
        "local": len(every) - served,
        "unbuildable": unbuildable,
        "served_pct": round(100.0 * served / len(every), 1) if every else None,
        "served_pct_of_buildable": round(100.0 * served / buildable, 1) if buildable else None,
        "unbuildable_reasons": dict(
            Counter(str(g.get("reason") or "?") for g in every if is_unbuildable(g)).most_common()
        ),
        "by_node_type": dict(sorted(by_type.items(), key=lambda kv: (-kv[1]["graphs"], kv[0]))),
        "local_reasons": dict(reasons.most_common()),
        "sources": dict(Counter(str(g.get("source")) for g in every).most_common()),
        "provisional": sum(1 for g in every if g.get("provisional")),
    }


def again_check(first: Mapping[str, list[dict[str, Any]]], again: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each plan key served in the first plancache process, by how the second
    process got it the first time it built that graph: "hit" is the expected
    answer (later builds of the same graph in that process read its disk cache)."""
    served_keys: dict[str, str] = {}
    for gs in first.values():
        for g in gs:
            if is_served(g) and g.get("key"):
                served_keys.setdefault(g["key"], g.get("name", ""))
    first_seen: dict[str, dict[str, Any]] = {}
    for gs in again.values():
        for g in gs:
            if g.get("key"):
                first_seen.setdefault(g["key"], g)
    # A graph built locally in "again" has no key: match it by test and name.
    local_again = {(nodeid, g.get("name")): g for nodeid, gs in again.items() for g in gs if not is_served(g)}
    local_first = {
        g["key"]: (nodeid, g.get("name")) for nodeid, gs in first.items() for g in gs if is_served(g) and g.get("key")
    }
    answers: Counter[str] = Counter()
    provisional = 0
    not_hit = []
    for key, name in served_keys.items():
        seen = first_seen.get(key) or local_again.get(local_first[key])
        answer = str(seen.get("source")) if seen else "absent"
        answers[answer] += 1
        provisional += bool(seen and seen.get("provisional"))
        if answer != "hit":
            not_hit.append(
                {
                    "key": key,
                    "name": name,
                    "again": answer,
                    "reason": seen.get("reason") if seen else "not built in again",
                }
            )
    return {
        "served_keys": len(served_keys),
        "first_answer": dict(answers.most_common()),
        "still_provisional": provisional,
        "not_hit": not_hit,
    }


# ---- the report -----------------------------------------------------------------------------------------


@dataclass
class PhaseRun:
    phase: str
    limit_s: float = 0.0
    wall_s: float = 0.0
    rc: int | None = None
    timed_out: bool = False
    junit: bool = False
    cuda_cache: str = ""
    plan_cache: str = ""
    samples_wall_s: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    graphs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lost_graphs: int = 0
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(o.outcome for o in self.outcomes.values()).most_common())


def build_report(runs: Mapping[str, PhaseRun], meta: Mapping[str, Any]) -> dict[str, Any]:
    nodeids = sorted({n for run in runs.values() for n in run.outcomes})
    report: dict[str, Any] = {**meta, "phases": {}, "tests": {}, "comparisons": {}, "graphs": {}}
    for name, run in runs.items():
        report["phases"][name] = {
            "limit_s": round(run.limit_s),
            "wall_s": round(run.wall_s, 1),
            "samples_wall_s": round(run.samples_wall_s, 1),
            "rc": run.rc,
            "timed_out": run.timed_out,
            "junit_written": run.junit,
            "cuda_cache": run.cuda_cache,
            "plan_cache": run.plan_cache,
            "counts": run.counts(),
            "notes": run.notes,
        }
    for nodeid in nodeids:
        report["tests"][nodeid] = {
            name: asdict(run.outcomes.get(nodeid, Outcome(NOT_RUN))) for name, run in runs.items()
        }
    if "native" in runs:
        for other in PLANCACHE_PHASES:
            if other in runs:
                report["comparisons"][f"native-vs-{other}"] = compare(
                    runs["native"].outcomes, runs[other].outcomes, ("native", other)
                )
    for name in PLANCACHE_PHASES:
        if name in runs:
            report["graphs"][name] = {**graph_summary(runs[name].graphs), "lost": runs[name].lost_graphs}
    # Per test: graphs served/local in each plancache phase (which tests' graphs went local).
    report["graphs_per_test"] = {
        nodeid: {
            name: f"{sum(map(is_served, gs))}/{sum(not is_served(g) for g in gs)}"
            for name in PLANCACHE_PHASES
            if name in runs and (gs := runs[name].graphs.get(nodeid))
        }
        for nodeid in sorted({n for name in PLANCACHE_PHASES if name in runs for n in runs[name].graphs})
    }
    if "plancache" in runs and "again" in runs:
        report["again_check"] = again_check(runs["plancache"].graphs, runs["again"].graphs)
    return report


def differences(report: Mapping[str, Any]) -> int:
    return sum(len(c["differences"]) for c in report.get("comparisons", {}).values())


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows), ""]


def _cell(outcome: Mapping[str, Any]) -> str:
    return (
        f"{outcome['outcome']}: {outcome['message'][:120]}"
        if outcome["outcome"] != "passed" and outcome.get("message")
        else outcome["outcome"]
    )


def render_markdown(report: Mapping[str, Any]) -> str:
    phases = list(report["phases"])
    out = ["# The cuDNN frontend's own tests, natively and through plancache", ""]
    out += [
        f"Tests: {report.get('source', {}).get('commit', '?')} ({report.get('source', {}).get('frontend version of these tests', '?')}); "
        f"installed frontend and GPU: see versions. Selection: {', '.join(report.get('selection', {}).get('tests', []))}; "
        f"samples: {', '.join(report.get('selection', {}).get('samples', [])) or 'none'}.",
        "",
    ]
    if "error" in report:
        out += [f"**The run ended early: {report['error']}**", ""]
    out += ["## Phases", ""]
    kinds = sorted({k for p in report["phases"].values() for k in p["counts"]}, key=RANK.index)
    rows = [
        [
            name,
            p["limit_s"],
            p["wall_s"],
            p["rc"],
            "yes" if p["timed_out"] else "",
            *(p["counts"].get(k, 0) for k in kinds),
        ]
        for name, p in report["phases"].items()
    ]
    out += _table(["phase", "limit s", "wall s", "rc", "cut at limit", *kinds], rows)
    for name, comparison in report["comparisons"].items():
        out += [f"## Outcomes that differ, {name}: {len(comparison['differences']) or 'none'}", ""]
        if comparison["differences"]:
            out += _table(
                ["test", *name.split("-vs-")],
                [[d["nodeid"], *(_cell(d[p]) for p in name.split("-vs-"))] for d in comparison["differences"]],
            )
        if comparison["incomplete"]:
            out += [f"Not run on one side (its phase ended first): {len(comparison['incomplete'])}.", ""]
        if comparison["other_skip_reason"]:
            out += [
                f"Skipped on both sides for another reason: {', '.join(d['nodeid'] for d in comparison['other_skip_reason'])}.",
                "",
            ]
    for name, g in report["graphs"].items():
        out += [
            f"## Graphs, {name}: {g['total']} built, {g['served']} served, {g['local']} local ({g['served_pct']}% served)",
            "",
            f"Of the {g['total'] - g.get('unbuildable', 0)} graphs the frontend itself builds (its own build of the other "
            f"{g.get('unbuildable', 0)} fails too): **{g.get('served_pct_of_buildable')}% served**.",
            "",
        ]
        out += _table(
            ["node type", "graphs", "served", "local", "of which the frontend cannot build either"],
            [[t, r["graphs"], r["served"], r["local"], r.get("unbuildable", 0)] for t, r in g["by_node_type"].items()],
        )
        out += _table(["source", "graphs"], list(map(list, g["sources"].items())))
        if g["local_reasons"]:
            out += _table(["built locally because", "graphs"], list(map(list, g["local_reasons"].items())))
    if "again_check" in report:
        check = report["again_check"]
        out += [
            f"## Again: {check['first_answer'].get('hit', 0)} of {check['served_keys']} plans served before were hits",
            "",
        ]
        if check["not_hit"]:
            out += _table(
                ["plan key", "graph", "answer in again", "why"],
                [[d["key"][:16], d["name"], d["again"], d["reason"]] for d in check["not_hit"]],
            )
    if "tuned_wait" in report:
        out += [f"Tuned wait: {json.dumps(report['tuned_wait'])[:600]}", ""]
    out += ["## Every test", ""]
    per_test = report.get("graphs_per_test", {})
    graph_phases = [p for p in PLANCACHE_PHASES if p in phases]
    out += [f"Graphs: served/local per test{' (' + ', '.join(graph_phases) + ')' if graph_phases else ''}.", ""]
    rows = [
        [nodeid, *(_cell(t[p]) for p in phases), *(per_test.get(nodeid, {}).get(p, "") for p in graph_phases)]
        for nodeid, t in report["tests"].items()
    ]
    out += _table(["test", *phases, *(f"graphs {p}" for p in graph_phases)], rows)
    out += ["## Rewrite (plancache copy)", ""]
    out += _table(
        ["file", "lines rewritten", "kept as is"],
        [[f, r["rewritten"], "; ".join(r["kept"])] for f, r in report.get("rewrites", {}).items()],
    )
    out += ["## Left out of the default selection", ""]
    out += _table(["tests", "why"], [[k, v] for k, v in report.get("excluded", {}).items()])
    return "\n".join(out)


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The short table printed last (what a device call's output tail shows)."""
    lines = [
        f"{'phase':<10} {'wall_s':>7} {'rc':>4} {'tests':>6} {'passed':>6} {'failed':>6} {'skipped':>7} {'error':>5} {'other':>5} "
        f"{'graphs':>6} {'served':>6} {'local':>5} {'served%':>7}"
    ]
    for name, p in report["phases"].items():
        c = p["counts"]
        other = sum(v for k, v in c.items() if k not in ("passed", "failed", "skipped", "error"))
        g = report["graphs"].get(name, {})
        lines.append(
            f"{name:<10} {p['wall_s']:>7} {p['rc']!s:>4} {sum(c.values()):>6} {c.get('passed', 0):>6} {c.get('failed', 0):>6} {c.get('skipped', 0):>7} "
            f"{c.get('error', 0):>5} {other:>5} {g.get('total', '-')!s:>6} {g.get('served', '-')!s:>6} {g.get('local', '-')!s:>5} "
            f"{g.get('served_pct', '-')!s:>7}{'  (cut at its limit)' if p['timed_out'] else ''}"
        )
    if "error" in report:
        lines.append(f"RUN ENDED EARLY: {report['error']}")
    for name, comparison in report["comparisons"].items():
        diffs = comparison["differences"]
        lines.append(
            f"{name}: {len(diffs)} outcome(s) differ"
            + "".join(
                f"\n  {d['nodeid']}: {' / '.join(_cell(v) for k, v in d.items() if k != 'nodeid')}" for d in diffs[:20]
            )
        )
        if comparison["incomplete"]:
            lines.append(f"  ({len(comparison['incomplete'])} not run on one side)")
    if "plancache" in report["graphs"]:
        plancache = report["graphs"]["plancache"]
        lines.append(
            f"of the graphs the frontend builds itself: {plancache.get('served_pct_of_buildable')}% served "
            f"({plancache.get('unbuildable', 0)} more fail in the frontend's own build too)"
        )
        lines.append(
            "node type: graphs/served/local/unbuildable (plancache): "
            + ", ".join(
                f"{t} {r['graphs']}/{r['served']}/{r['local']}/{r.get('unbuildable', 0)}"
                for t, r in plancache["by_node_type"].items()
            )
        )
        for reason, count in list(report["graphs"]["plancache"]["local_reasons"].items())[:8]:
            lines.append(f"  local x{count}: {reason[:200]}")
    if "again_check" in report:
        check = report["again_check"]
        lines.append(
            f"again: of {check['served_keys']} plans served in plancache, first answers {check['first_answer']}"
        )
    return lines
