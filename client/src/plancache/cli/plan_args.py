"""What the commands that name a plan share: the spec file read, the options from the flags, and --target
completed from the server's live targets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plancache.errors import InvalidRequest
from plancache.graphspec.graph import GraphSpec
from plancache.keys.options import CompileOptions
from plancache.keys.target import Target
from plancache.transport.client import Client


def load_spec(path: Path) -> GraphSpec:
    return GraphSpec.from_json(path.read_text())


def compile_options(args: argparse.Namespace) -> CompileOptions:
    return CompileOptions(
        autotune=not args.no_autotune,
        excluded_behavior_notes=tuple(args.exclude_note),
        workspace_limit=args.workspace_limit,
    )


def resolve_target(client: Client, text: str | None, timeout: float | None) -> Target | str | None:
    """--target as given, completed from the server's live targets when it is
    only a prefix ("sm_90"); without it, this machine's GPU (None), or an error
    that lists what the server can build."""
    if text is None:
        try:
            from plancache.gpu.target import detect_target

            detect_target()
            return None
        except InvalidRequest as e:
            raise InvalidRequest(
                f"{e.message.split(':')[0]}: pass --target ({_live_targets(client, timeout)})"
            ) from None
    try:
        return Target.parse(text)
    except InvalidRequest:
        matches = [
            t.target_id
            for t in client.admin.list_targets(timeout=timeout)
            if t.target_id == text or t.target_id.startswith(text.rstrip("/") + "/")
        ]
        longest = max(matches, key=len, default="")
        if matches and all(longest == m or longest.startswith(m + "/") for m in matches):
            matches = [longest]  # a GPU's exact target and its generic forms: the exact one
        if len(matches) == 1:
            print(f"target: {matches[0]}", file=sys.stderr)
            return matches[0]
        if matches:
            raise InvalidRequest(
                f"--target {text} matches several targets the server has workers for: {', '.join(matches)}"
            ) from None
        raise InvalidRequest(
            f"--target {text} is not a full target id and matches none the server has workers for "
            f"({_live_targets(client, timeout)})"
        ) from None


def _live_targets(client: Client, timeout: float | None) -> str:
    live = [t.target_id for t in client.admin.list_targets(timeout=timeout) if t.live_workers]
    return "the server has workers for: " + ", ".join(live) if live else "the server has no live worker now"
