"""What a target's warming has done: its plan's counts, recent failures and
coverage, read back from Redis (plancache_server.store.warming)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from plancache.errors import InvalidRequest
from plancache.v1 import plancache_pb2 as pb
from plancache_server.store import keys
from plancache_server.store.redis_conn import text, translated_errors
from plancache_server.store.warm_items import ACTIVE, BUILT, FAILED, SKIPPED, WarmItem, loads

FAILURES_SHOWN = 20


@dataclass
class WarmStatus:
    target_id: str
    source: str
    state: str
    total: int
    built: int = 0
    skipped: int = 0
    failed: int = 0
    in_flight: int = 0
    source_hits: float = 0.0  # the source's hits in the last 24 h when the plan was made
    covered_hits: float = 0.0  # of those, the hits of items whose plan is stored for the target now
    missing_specs: int = 0  # source plans no worker stored a spec for (built before specs were kept)
    created_at: float = 0.0
    updated_at: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (plan key, reason), newest first

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.built - self.skipped - self.failed)

    @property
    def coverage(self) -> float:
        return (
            self.covered_hits / self.source_hits
            if self.source_hits
            else (1.0 if self.total == self.built + self.skipped else 0.0)
        )

    def to_proto(self) -> pb.WarmTargetStatus:
        return pb.WarmTargetStatus(
            target_id=self.target_id,
            source=self.source,
            state=self.state,
            total=self.total,
            built=self.built,
            skipped=self.skipped,
            failed=self.failed,
            in_flight=self.in_flight,
            remaining=self.remaining,
            source_hits_24h=self.source_hits,
            covered_hits_24h=self.covered_hits,
            coverage=self.coverage,
            missing_specs=self.missing_specs,
            created_at=self.created_at,
            updated_at=self.updated_at,
            failures=[pb.WarmFailure(plan_key=k, reason=r) for k, r in self.failures],
        )


class WarmProgress:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def targets(self) -> list[str]:
        with translated_errors("listing warmed targets"):
            return sorted(text(t) for t in self._redis.smembers(keys.WARM_TARGETS))

    def status(self, target_id: str) -> WarmStatus:
        with translated_errors("reading a warming plan"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(keys.warm_plan(target_id))
            pipe.hgetall(keys.warm_outcomes(target_id))
            pipe.hlen(keys.warm_in_flight(target_id))
            pipe.lrange(keys.warm_items(target_id), 0, -1)
            raw_plan, raw_outcomes, in_flight, raw_items = pipe.execute()
        if not raw_plan:
            raise InvalidRequest(f"target {target_id} has no warming plan")
        record = {text(k): loads(v) for k, v in raw_plan.items()}
        status = WarmStatus(
            target_id,
            str(record.get("source", "")),
            str(record.get("state", ACTIVE)),
            int(record.get("total", 0)),
            in_flight=int(in_flight),
            source_hits=float(record.get("source_hits", 0.0)),
            missing_specs=int(record.get("missing_specs", 0)),
            created_at=float(record.get("created_at", 0.0)),
            updated_at=float(record.get("updated_at", 0.0)),
        )
        failures: list[tuple[float, str, str]] = []
        for _, raw in raw_outcomes.items():
            outcome = loads(raw)
            if not isinstance(outcome, dict):
                continue
            kind = outcome.get("outcome")
            if kind == BUILT:
                status.built += 1
            elif kind == SKIPPED:
                status.skipped += 1
            elif kind == FAILED:
                status.failed += 1
                failures.append(
                    (
                        float(outcome.get("at", 0.0)),
                        str(outcome.get("plan_key", ""))[:300],
                        str(outcome.get("reason", ""))[:500],
                    )
                )
        status.failures = [(k, r) for _, k, r in sorted(failures, reverse=True)[:FAILURES_SHOWN]]
        items = [WarmItem.decode(i, raw) for i, raw in enumerate(raw_items)]
        with translated_errors("reading what is stored"):
            pipe = self._redis.pipeline(transaction=False)
            for item in items:
                pipe.exists(keys.plan(item.plan_key))
            stored = pipe.execute() if items else []
        status.covered_hits = sum(item.hits for item, present in zip(items, stored, strict=True) if present)
        return status

    def all_status(self) -> list[WarmStatus]:
        found = []
        for target_id in self.targets():
            try:
                found.append(self.status(target_id))
            except InvalidRequest:
                continue  # listed, then replaced or gone
        return found

    def created_at(self, target_id: str) -> float | None:
        """When the target's warming plan was made (None: it has none)."""
        with translated_errors("reading a warming plan"):
            raw = self._redis.hget(keys.warm_plan(target_id), "created_at")
        value = loads(raw) if raw is not None else None
        return float(value) if isinstance(value, int | float) else None
