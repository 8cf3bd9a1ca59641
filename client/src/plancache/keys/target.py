"""Targets: what a serialized plan is valid on.

A blob deserializes only where the GPU architecture, the cuDNN backend
version and the frontend version match what built it. Device name and SM
count are optional refinements: an H100 PCIe and an H200 are both sm_90, but
autotuning on one can pick a plan that is slower on the other.

A target's id is its stable text form, used in plan keys, job streams and
stats: `sm_90/cudnn-91900/fe-1.32.0[/dev-nvidia-h200][/sms-132]`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

from plancache.errors import InvalidRequest
from plancache.v1 import plancache_pb2 as pb

_CC = re.compile(r"^sm_\d{2,3}[a-z]?$")
_VERSION = re.compile(r"^\d+(\.\d+){1,3}([a-z0-9.+-]*)$")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class Target:
    compute_capability: str
    cudnn_version: int
    frontend_version: str
    device_name: str = ""
    sm_count: int = 0

    def __post_init__(self) -> None:
        if not _CC.match(self.compute_capability):
            raise InvalidRequest(f"target: compute capability {self.compute_capability!r} is not like 'sm_90'")
        if not 0 < self.cudnn_version < 10**7:
            raise InvalidRequest(f"target: cudnn_version {self.cudnn_version} is not like 91900")
        if not _VERSION.match(self.frontend_version):
            raise InvalidRequest(f"target: frontend_version {self.frontend_version!r} is not like '1.32.0'")
        if self.device_name and not slug(self.device_name):
            raise InvalidRequest(f"target: device name {self.device_name!r} has no letters or digits")
        if len(self.device_name) > 128:
            raise InvalidRequest("target: device name longer than 128 characters")
        if not 0 <= self.sm_count < 100_000:
            raise InvalidRequest(f"target: sm_count {self.sm_count} out of range")

    @functools.cached_property
    def id(self) -> str:
        """Computed once per target (hot on the hit path)."""
        parts = [self.compute_capability, f"cudnn-{self.cudnn_version}", f"fe-{self.frontend_version}"]
        if self.device_name:
            parts.append(f"dev-{slug(self.device_name)}")
        if self.sm_count:
            parts.append(f"sms-{self.sm_count}")
        return "/".join(parts)

    def generic(self) -> Target:
        """The same target without device refinements: what any such GPU can build."""
        return replace(self, device_name="", sm_count=0)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def parse(cls, text: str) -> Target:
        """Inverse of `id` (the device name comes back as its slug)."""
        parts = text.strip().strip("/").split("/")
        if len(parts) < 3 or not parts[1].startswith("cudnn-") or not parts[2].startswith("fe-"):
            raise InvalidRequest(f"target {text!r} is not like 'sm_90/cudnn-91900/fe-1.32.0[/dev-NAME][/sms-N]'")
        try:
            cudnn_version = int(parts[1].removeprefix("cudnn-"))
        except ValueError:
            raise InvalidRequest(f"target {text!r}: cudnn version must be an integer like 91900") from None
        device, sms = "", 0
        for extra in parts[3:]:
            if extra.startswith("dev-") and not device:
                device = extra.removeprefix("dev-")
            elif extra.startswith("sms-") and extra.removeprefix("sms-").isdigit() and not sms:
                sms = int(extra.removeprefix("sms-"))
            else:
                raise InvalidRequest(f"target {text!r}: unexpected part {extra!r}")
        return cls(parts[0], cudnn_version, parts[2].removeprefix("fe-"), device, sms)

    def to_proto(self) -> pb.Target:
        return pb.Target(
            compute_capability=self.compute_capability,
            cudnn_version=self.cudnn_version,
            frontend_version=self.frontend_version,
            device_name=self.device_name,
            sm_count=self.sm_count,
        )

    @classmethod
    def from_proto(cls, msg: pb.Target) -> Target:
        if not msg.compute_capability:
            raise InvalidRequest("target is missing (compute capability, cuDNN and frontend versions)")
        return cls(msg.compute_capability, msg.cudnn_version, msg.frontend_version, msg.device_name, msg.sm_count)
