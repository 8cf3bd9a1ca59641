"""The status page rendered by its jinja2 templates: every section of a full report is there, whatever a
caller, a worker or a node wrote into Redis is shown as text (autoescape, in every template), and the
gateway's signing keys get a section when the status lists them."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import time
import types
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import pytest

from plancache_server.store.build_records import FailedBuild
from plancache_server.web import status_page
from plancache_server.web.status_page import environment, render
from tests.support.status_reports import HOSTILE, KEY, NOW, empty_report, full_report

SECTIONS = (
    "targets",
    "target-counts",
    "fleet",
    "hit-rate",
    "top-hits",
    "top-saved",
    "warming",
    "workloads",
    "graph-families",
    "failures",
    "lost-to-repair",
    "retirable",
    "families",
)


class _Page(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []  # as a browser shows them
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    def ids(self) -> list[str]:
        return [a["id"] for _, a in self.tags if "id" in a]

    def attr(self, name: str) -> list[str]:
        return [a[name] for _, a in self.tags if name in a]


def test_a_full_report_renders_every_section_in_order() -> None:
    assert _Page(render(full_report())).ids() == list(SECTIONS)


def test_a_worker_name_with_a_script_tag_is_shown_as_text() -> None:
    worker = "<script>alert(document.cookie)</script>"
    failure = FailedBuild(at=NOW, plan_key=KEY, worker=worker, reason="lost", rejected=False)
    report = dataclasses.replace(empty_report(), recent_failures=[failure])
    page = _Page(render(report))
    assert "script" not in {tag for tag, _ in page.tags}
    assert worker in page.texts


def test_what_came_from_outside_stays_text_in_every_section() -> None:
    page = _Page(render(full_report(HOSTILE)))
    tags = {tag for tag, _ in page.tags}
    assert "script" not in tags and "img" not in tags
    shown = " ".join(page.texts)
    for text in ("target", "engine", "worker", "reason", "source", "why", "old", "door", "family", "node", "means"):
        assert f"{HOSTILE}-{text}" in shown, text
    # Attribute values hold the text whole: nothing broke out of its quotes.
    assert f"{HOSTILE}-target" in page.attr("data-target")
    assert f"{HOSTILE}-reason" in page.attr("data-reason")
    assert f"{HOSTILE}/{KEY}" in page.attr("data-plan-key")
    assert f"{HOSTILE}-family" in page.attr("data-family")


def test_every_template_escapes_even_one_added_later() -> None:
    env = environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    assert all(name.endswith((".j2", ".css")) for name in env.list_templates())


SIGNING_KEYS = [
    {"key_id": "k-2026-01", "fingerprint": "SHA256:9f86d081884c7d65", "state": "active"},
    {"key_id": "k-2025-06", "fingerprint": "SHA256:60303ae22b998861", "state": "retired"},
    {"key_id": "<script>k</script>", "fingerprint": "<b>f</b>", "state": "<i>s</i>"},
]


def test_signing_keys_get_a_section_when_the_status_lists_them() -> None:
    page = _Page(render(empty_report(), signing_keys=SIGNING_KEYS))
    assert "signing-keys" in page.ids()
    assert page.attr("data-key-id") == [k["key_id"] for k in SIGNING_KEYS]
    assert page.attr("data-state") == [k["state"] for k in SIGNING_KEYS]
    assert "SHA256:9f86d081884c7d65" in page.texts and "<script>k</script>" in page.texts
    assert not {"script", "b", "i"} & {tag for tag, _ in page.tags}


def test_the_reports_own_signing_keys_are_shown_and_none_means_no_section() -> None:
    report = empty_report()
    with_keys = types.SimpleNamespace(**{f.name: getattr(report, f.name) for f in dataclasses.fields(report)})
    with_keys.signing_keys = SIGNING_KEYS[:1]
    assert _Page(render(with_keys)).attr("data-key-id") == ["k-2026-01"]  # type: ignore[arg-type]
    assert "signing-keys" not in _Page(render(report)).ids()
    assert "signing-keys" not in _Page(render(report, signing_keys=[])).ids()


def test_a_render_leaves_no_reference_cycle_holding_the_report() -> None:
    """A macro bound to the render's context (an import `with context`, a macro defined in an included
    template) made each render a reference cycle holding the whole report: garbage until a full collection,
    which a gateway with a large heap runs rarely (bench/soak.py: the gateway's memory grew ~2 MB a half
    hour with it). Rendering now leaves nothing for the cycle collector."""
    report = full_report()
    render(report)  # the templates compiled, the macros module made (kept by the environment)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            render(report)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not [kind for kind in garbage if kind in ("Context", "Macro", "StatusReport")], garbage[:20]


def test_templates_changed_on_disk_under_a_running_gateway_change_nothing_it_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway renders the templates of the code it runs: a newer package installed under it (a template that
    reads a field its Python has not got) does not fail its page (it did: every render of a soak's gateway, once
    a template file changed under it)."""
    templates = tmp_path / "templates"
    shutil.copytree(Path(status_page.__file__).parent / "templates", templates)
    monkeypatch.setattr(status_page, "environment", lambda: env)
    env = status_page.make_environment(jinja2.FileSystemLoader(str(templates)))
    before = render(full_report())
    operations = templates / "operations.html.j2"  # included by the page: loaded with it, at the first render
    operations.write_text(operations.read_text() + "{{ report.field_of_a_newer_release }}\n")
    later = time.time() + 60
    os.utime(operations, (later, later))
    assert render(full_report()) == before
    env = status_page.make_environment(jinja2.FileSystemLoader(str(templates)))  # a gateway started now: its files
    with pytest.raises(jinja2.UndefinedError, match="field_of_a_newer_release"):
        render(full_report())
