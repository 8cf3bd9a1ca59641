"""This thread's cuDNN handle on a local GPU, as plancache's plans run on it."""

from __future__ import annotations

from typing import Any

from plancache.run.execution import handle_state

__all__ = ["cudnn_handle"]


def cudnn_handle(device: int | None = None) -> Any:
    """This thread's cuDNN handle on `device` (a handle must not cross threads).

    plancache remembers which stream it set on this handle and sets it again
    only when the current torch stream differs: do not call
    `cudnn.set_stream` on it yourself (create your own handle for that)."""
    return handle_state(device).handle
