"""Manifests: the plans a node needs at start-up, as one JSON file.

    {"version": 1,
     "target": "sm_90/cudnn-91900/fe-1.32.0/dev-nvidia-h200/sms-132",
     "options": {"autotune": true},
     "entries": [{"name": "attention", "key": "<plan key>", "spec": {...}},
                 {"name": "mlp", "key": "<plan key>"}],
     "families": [{"version": 1, "example": {...}, "varying": [...]}]}

An entry names a plan by key, by spec (compiled for the manifest's target
and options), or both: the key is what is looked up, the spec is what lets a
missing plan be compiled. `target` may be left out: the node's GPU is used. `families` (optional)
name graph families instead of every size (plancache.graphspec.family): a
prefetch has the service build each (what is not stored), and each size
is then a hit at its first use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancache.errors import InvalidRequest, PlanCacheError
from plancache.graphspec import spec_io
from plancache.graphspec.family import Family
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.plankey import parse_key
from plancache.keys.query import PlanQuery
from plancache.keys.target import Target

MANIFEST_VERSION = 1


@dataclass
class ManifestEntry:
    key: str | None = None
    spec: GraphSpec | None = None
    name: str = ""

    def label(self, index: int) -> str:
        return f"entry {index}" + (f" ({self.name})" if self.name else "")


@dataclass
class Manifest:
    entries: list[ManifestEntry] = field(default_factory=list)
    target: Target | None = None
    options: CompileOptions = field(default_factory=CompileOptions)
    families: list[Family] = field(default_factory=list)

    @classmethod
    def from_specs(
        cls,
        specs: Sequence[GraphSpec],
        target: Target,
        options: CompileOptions | None = None,
        names: Sequence[str] = (),
    ) -> Manifest:
        """A manifest with keys (to fetch) and specs (to compile what is missing)."""
        manifest = cls(target=target, options=options or CompileOptions())
        for i, spec in enumerate(specs):
            entry = ManifestEntry(spec=spec, name=names[i] if i < len(names) else spec.name)
            entry.key = manifest.key_of(entry, target)
            manifest.entries.append(entry)
        return manifest

    def key_of(self, entry: ManifestEntry, target: Target | None) -> str:
        """The plan key an entry names, for `target` when it names a spec."""
        if entry.spec is not None:
            return self.query_of(entry, target).key
        assert entry.key is not None
        return entry.key

    def query_of(self, entry: ManifestEntry, target: Target | None) -> PlanQuery:
        """What an entry with a spec asks for on `target` with the manifest's options."""
        if entry.spec is None:
            raise InvalidRequest("a manifest entry without a spec names one plan key, not a query")
        if target is None:
            raise InvalidRequest("a manifest entry with a spec needs a target (in the manifest, or passed)")
        return PlanQuery.of(entry.spec, target, self.options)

    def to_json(self, indent: int | None = 2) -> str:
        data: dict[str, Any] = {"version": MANIFEST_VERSION}
        if self.target is not None:
            data["target"] = self.target.id
        data["options"] = {
            "autotune": self.options.autotune,
            "heuristic_modes": list(self.options.heuristic_modes),
            "workspace_limit": self.options.workspace_limit,
            "excluded_behavior_notes": list(self.options.excluded_behavior_notes),
        }
        data["entries"] = []
        for entry in self.entries:
            item: dict[str, Any] = {"name": entry.name} if entry.name else {}
            if entry.key:
                item["key"] = entry.key
            if entry.spec is not None:
                item["spec"] = spec_io.to_dict(entry.spec)
            data["entries"].append(item)
        if self.families:
            data["families"] = [f.to_dict() for f in self.families]
        return json.dumps(data, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InvalidRequest(f"manifest is not valid JSON: {e}") from e
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise InvalidRequest(f'manifest: expected an object with "version": {MANIFEST_VERSION}')
        unknown = set(data) - {"version", "target", "options", "entries", "families"}
        if unknown:
            raise InvalidRequest(f"manifest: unknown field(s) {', '.join(sorted(unknown))}")
        raw_options = data.get("options", {})
        if not isinstance(raw_options, dict):
            raise InvalidRequest("manifest: options must be an object")
        try:
            options = CompileOptions(
                autotune=bool(raw_options.get("autotune", True)),
                heuristic_modes=tuple(raw_options.get("heuristic_modes", ("A", "FALLBACK"))),
                workspace_limit=int(raw_options.get("workspace_limit", 0)),
                excluded_behavior_notes=tuple(raw_options.get("excluded_behavior_notes", ())),
            )
        except (TypeError, ValueError) as e:
            raise InvalidRequest(f"manifest: bad options: {e}") from e
        target = Target.parse(data["target"]) if data.get("target") else None
        manifest = cls(target=target, options=options)
        entries = data.get("entries", [])
        if not isinstance(entries, list):
            raise InvalidRequest("manifest: entries must be a list")
        for i, raw in enumerate(entries):
            manifest.entries.append(_entry(raw, i, manifest))
        families = data.get("families", [])
        if not isinstance(families, list):
            raise InvalidRequest("manifest: families must be a list")
        for i, raw in enumerate(families):
            try:
                manifest.families.append(Family.from_dict(raw))
            except PlanCacheError as e:
                raise InvalidRequest(f"manifest family {i}: {e.message}") from None
        return manifest

    def save(self, path: Path | str) -> None:
        """Write the manifest (to_json) to `path`, whole or not at all."""
        target = Path(path)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(self.to_json())
        partial.replace(target)

    @classmethod
    def load(cls, path: Path | str) -> Manifest:
        return cls.from_json(Path(path).read_text())


def _entry(raw: Any, index: int, manifest: Manifest) -> ManifestEntry:
    if not isinstance(raw, dict) or not ({"key", "spec"} & set(raw)):
        raise InvalidRequest(f"manifest entry {index}: needs a key or a spec")
    unknown = set(raw) - {"name", "key", "spec"}
    if unknown:
        raise InvalidRequest(f"manifest entry {index}: unknown field(s) {', '.join(sorted(unknown))}")
    entry = ManifestEntry(key=raw.get("key"), name=str(raw.get("name", "")))
    where = entry.label(index)
    try:
        if "spec" in raw:
            entry.spec = spec_io.from_dict(raw["spec"])
        if entry.key is not None:
            parse_key(entry.key)
        if entry.key is not None and entry.spec is not None and manifest.target is not None:
            expected = manifest.key_of(ManifestEntry(spec=entry.spec), manifest.target)
            if expected != entry.key:
                raise InvalidRequest(f"its key does not match its spec, target and options (expected {expected})")
    except PlanCacheError as e:
        raise type(e)(f"manifest {where}: {e.message}") from e
    return entry
