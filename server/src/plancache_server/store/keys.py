"""Every Redis key name plancache uses. Nothing else formats a key.

Keys that belong to one plan carry the plan key as a hash tag
(`plancache:{<plan key>}:...`) so that a plan, its build lease and its job
state live on one shard of a Redis Cluster.
"""

from __future__ import annotations

import re

from plancache.keys.target import Target

PREFIX = "plancache"

# Pub/sub channel on which workers announce finished jobs.
EVENTS_CHANNEL = f"{PREFIX}:events"
# Consumer group shared by every worker on a job stream.
JOB_GROUP = "workers"
# Set of target ids any worker ever announced (for messages and stats).
KNOWN_TARGETS = f"{PREFIX}:targets"
# Set of counter scopes ("target:<id>", "family:<name>").
STATS_SCOPES = f"{PREFIX}:stats-scopes"
# Sorted sets: plan key -> hits, and -> build seconds its hits saved (status page).
TOP_HITS = f"{PREFIX}:top:hits"
TOP_SECONDS_SAVED = f"{PREFIX}:top:seconds-saved"
# List of the latest failed builds (JSON, newest first, capped).
RECENT_FAILURES = f"{PREFIX}:recent-failures"
# Sorted set: plan key -> when it was last written or served (unix seconds).
PLAN_INDEX = f"{PREFIX}:plan-index"
# Sorted set: plan key -> when it was warmed, for warmed plans not served yet:
# least recently used before any served plan, kept for the retention from when warmed.
WARMED_INDEX = f"{PREFIX}:warmed-index"
# Hash: "<bytes|plans|evicted|expired>:<target id>" -> count (plancache_server.store.lifecycle).
STORE_COUNTERS = f"{PREFIX}:store"
# Hash: target id -> when a worker last advertised it (unix seconds): retirement.
TARGETS_LAST_SEEN = f"{PREFIX}:targets-last-seen"
# Set of the target ids with a warming plan (plancache_server.store.warming).
WARM_TARGETS = f"{PREFIX}:warm-targets"
# Sorted set: "<target>|<reason>|<node type>|<spec hash>" -> graphs nodes built
# locally (reported by nodes whose operator opted in to spec hashes; capped).
# Under the stats prefix: a gateway's ACL already covers it.
FLEET_LOCAL_SPECS = f"{PREFIX}:stats-fleet-local-specs"
# Sorted set: plan key -> when a repair of the private store lost it; dropped once it is stored again.
REPAIR_LOST = f"{PREFIX}:repair-lost"
# Sorted set: "<target id>|<workload>" -> when a process of it last reported (unix seconds); capped.
WORKLOADS = f"{PREFIX}:workloads"


def workload_recency(target_id: str, workload: str) -> str:
    """Sorted set: plan key -> when a process of the workload last used it (unix seconds)."""
    return f"{PREFIX}:{{workload:{target_id}|{workload}}}:recency"


def workload_order(target_id: str, workload: str) -> str:
    """Hash: plan key -> the order a process of the workload first used it in (its latest report)."""
    return f"{PREFIX}:{{workload:{target_id}|{workload}}}:order"


def workload_counts(target_id: str, workload: str) -> str:
    """Hash: processes, listed, prefetched, used, wasted, recorded -> counts (the status page's)."""
    return f"{PREFIX}:{{workload:{target_id}|{workload}}}:counts"


def workload_verdicts(target_id: str, workload: str) -> str:
    """List: the workload's last processes' verdicts on their start-up stream, newest first ("1" served, "0" not)."""
    return f"{PREFIX}:{{workload:{target_id}|{workload}}}:verdicts"


def store_counter(kind: str, target_id: str) -> str:
    return f"{kind}:{target_id}"


def plan(plan_key: str) -> str:
    """Hash: blob, meta (serialized PlanMetadata)."""
    return f"{PREFIX}:{{{plan_key}}}:plan"


def plan_pattern_for_target(target_id: str) -> str:
    """SCAN pattern matching every plan hash of one target."""
    escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in target_id)
    return f"{PREFIX}:{{*/{escaped}/opt-*}}:plan"


def plan_key_of(redis_key: str) -> str:
    """The plan key inside a plan hash's Redis key."""
    return redis_key[redis_key.index("{") + 1 : redis_key.rindex("}")]


_PLAN_NAMED = re.compile(rb"%s:\{([^{}\s]{1,1024})\}:plan" % PREFIX.encode())


def plan_keys_named_in(data: bytes) -> set[str]:
    """The plan keys of the plan hashes named anywhere in `data` (bytes of an
    append-only file: the commands a repair cut away)."""
    return {m.decode(errors="replace") for m in _PLAN_NAMED.findall(data)}


def build_lease(plan_key: str) -> str:
    """String: id of the job building this plan; expires."""
    return f"{PREFIX}:{{{plan_key}}}:lease"


def job_state(plan_key: str) -> str:
    """Hash: job_id, state, error, worker, updated_at of the latest build, and building: the worker that started
    its first plan (BuildRecorder.claim_start)."""
    return f"{PREFIX}:{{{plan_key}}}:job"


def job_yields(plan_key: str) -> str:
    """String: the id of this plan's job that yields (only callers that build the plan themselves asked for it:
    Job.yields), set by the gateway that queued it; the first caller on any gateway that waits for the plan takes
    it and hurries that job, once (plancache_server.gateway.flight); expires."""
    return f"{PREFIX}:{{{plan_key}}}:yields"


def job_wanted(plan_key: str) -> str:
    """Hash: "<gateway id>|<job id>" -> until when (Redis' clock, ms) that gateway has callers waiting for
    that job of the plan (plancache_server.store.build_records: a job nobody waits for is dropped)."""
    return f"{PREFIX}:{{{plan_key}}}:wanted"


def failure(plan_key: str) -> str:
    """String: why cuDNN rejected this plan's graph (negative cache; expires)."""
    return f"{PREFIX}:{{{plan_key}}}:failed"


def untrusted_build(plan_key: str) -> str:
    """String: why a gateway refused this plan's last build (the key that
    signed it); no rebuild signed the same way is started while it lives."""
    return f"{PREFIX}:{{{plan_key}}}:untrusted"


def job_stream(target: Target) -> str:
    """Stream of build jobs for one target. A worker reads its exact and its
    generic target's streams in one XREADGROUP, so both carry the generic
    target as hash tag (one shard in a cluster)."""
    return f"{PREFIX}:{{jobs:{target.generic().id}}}:{target.id}"


def workers(target_id: str) -> str:
    """Sorted set: worker id -> heartbeat expiry (unix seconds)."""
    return f"{PREFIX}:workers:{target_id}"


def drain(worker_id: str) -> str:
    """String: present while a worker is asked to finish and leave."""
    return f"{PREFIX}:drain:{worker_id}"


def stats(scope: str) -> str:
    """Hash of total counters of one scope (a target or an op family)."""
    return f"{PREFIX}:stats:{scope}"


def stats_bucket(scope: str, unit: str, index: int) -> str:
    """Hash of one scope's counters in one minute ("m") or hour ("h")."""
    return f"{PREFIX}:stats:{scope}:{unit}{index}"


def spec_index(spec_hash: str) -> str:
    """Set of plan keys stored for one spec (any target, any options)."""
    return f"{PREFIX}:spec:{spec_hash}"


def spec_body(spec_hash: str) -> str:
    """String: the normalized spec (a serialized GraphSpec) whose hash this
    is, written by the workers that built it: what warming builds from
    (whoever reads it derives the hash again)."""
    return f"{PREFIX}:spec-body:{spec_hash}"


def plan_hits(hour: int | str) -> str:
    """Sorted set: plan key -> hits in one hour (unix hours; kept 26 h):
    warming orders specs by their recent hits. ("*": the pattern of all.)"""
    return f"{PREFIX}:plan-hits:h{hour}"


def _warm(target_id: str, part: str) -> str:
    # One hash tag per warmed target: its plan, items, lease and records live on one shard.
    return f"{PREFIX}:{{warm:{target_id}}}:{part}"


def warm_plan(target_id: str) -> str:
    """Hash: a target's warming plan (source, state, counts, cursor)."""
    return _warm(target_id, "plan")


def warm_items(target_id: str) -> str:
    """List: the plan's items in build order (JSON: plan key, source key, hits, query)."""
    return _warm(target_id, "items")


def warm_outcomes(target_id: str) -> str:
    """Hash: item index -> its outcome (JSON: done, skipped or failed with the reason)."""
    return _warm(target_id, "outcomes")


def warm_in_flight(target_id: str) -> str:
    """Hash: item index -> the worker building it (handed to another when its lease moves)."""
    return _warm(target_id, "in-flight")


def warm_retry(target_id: str) -> str:
    """List: indices of items to build again (left in flight by a worker that went away)."""
    return _warm(target_id, "retry")


def warm_lease(target_id: str) -> str:
    """String: the worker warming this target (one at a time across the fleet); expires."""
    return _warm(target_id, "lease")


# Sorted set: graph family key -> when first asked for (the status page lists the latest; bounded).
GRAPH_FAMILIES = f"{PREFIX}:graph-families"


def family_cancelled(target_id: str) -> str:
    """Set: plan keys of cancelled graph families' members not built yet (CancelFamily): a worker skips
    a warming item of one (plancache_server.worker.warm_intake). Expires with its last cancel."""
    return _warm(target_id, "family-cancelled")


def family_budget(target_id: str, day: int) -> str:
    """Hash: workload -> graph family members queued for it on `target_id` in one unix day
    (--family-budget bounds it). Expires after two days."""
    return _warm(target_id, f"family-budget:d{day}")


def graph_family(family_key: str) -> str:
    """Hash: a graph family built for a target (plancache.graphspec.family): its
    definition, its graphs' plan keys, when it was asked for. Informational:
    what is built is derived from the definition, and every plan verified."""
    return f"{PREFIX}:graph-family:{family_key}"


# ---- Redis ACL users for a shared deployment -------------------------------------
#
# Gateways read plans but never write them (only workers do, and clients
# check the workers' signatures); workers write plans but not statistics.
# Patterns come from the key functions above. Lua scripts run with the
# caller's permissions, so the commands they call are listed too.

_PLAN = plan("*")
_PER_PLAN = {name: f"{PREFIX}:{{*}}:{name}" for name in ("lease", "job", "wanted", "failed", "untrusted", "yields")}
_JOB_STREAMS = f"{PREFIX}:{{jobs:*"
# +info: each process checks at start that Redis' eviction policy cannot drop plans, jobs or leases;
# +time: heartbeats are written and read on Redis' clock, not on each host's.
_COMMON = ["+ping", "+info", "+time", "+evalsha", "+eval", "+script|load", f"&{EVENTS_CHANNEL}"]

ACL_RULES: dict[str, list[str]] = {
    "gateway": [
        *_COMMON,
        "+hmget",
        "+hgetall",
        "+hset",
        "+expire",
        "+pexpire",
        "+get",
        "+set",
        "+del",
        "+ttl",
        "+smembers",
        "+sadd",
        "+scan",
        "+xadd",
        "+xlen",
        "+xpending",
        "+xrange",
        "+xdel",
        "+xinfo|groups",
        "+zcount",
        "+zrangebyscore",
        "+hincrbyfloat",
        "+zincrby",
        "+zremrangebyrank",
        "+zrevrange",
        "+zmscore",
        "+zrem",
        "+lrange",
        "+subscribe",
        "+unsubscribe",
        "+zadd",
        "+hincrby",
        "+hget",
        "+hgetall",
        "+rpush",
        "+hlen",
        "+hdel",
        "+exists",
        "+zrange",
        "+multi",
        "+exec",
        "+llen",
        "+ltrim",  # a graph family appended in turns with a warming list's items not taken yet (warm_plans)
        "+hsetnx",
        "+zcard",
        "+zpopmin",
        f"%R~{_PLAN}",
        f"~{PLAN_INDEX}",
        "+srem",
        "+hstrlen",
        f"~{WARMED_INDEX}",
        f"~{STORE_COUNTERS}",
        f"%R~{TARGETS_LAST_SEEN}",
        f"~{_PER_PLAN['lease']}",
        f"~{_PER_PLAN['job']}",
        f"~{_PER_PLAN['wanted']}",
        f"%R~{_PER_PLAN['failed']}",
        f"~{_PER_PLAN['untrusted']}",
        f"~{_PER_PLAN['yields']}",
        f"~{_JOB_STREAMS}",
        f"%R~{workers('*')}",
        f"%R~{KNOWN_TARGETS}",
        f"~{drain('*')}",
        f"~{PREFIX}:stats*",
        f"~{PREFIX}:top:*",
        f"%R~{RECENT_FAILURES}",
        # Invalidate removes a plan from its spec's index, and the spec's body with its last plan.
        f"~{spec_index('*')}",
        "+scard",
        f"~{spec_body('*')}",
        f"~{plan_hits('*')}",
        f"~{PREFIX}:{{warm:*",
        f"~{WARM_TARGETS}",
        f"~{graph_family('*')}",
        f"~{GRAPH_FAMILIES}",
        f"~{REPAIR_LOST}",
        f"~{WORKLOADS}",
        f"~{PREFIX}:{{workload:*",
        # Invalidate (an admin call) deletes plans (and a spec's body with its last plan): deleting is all it may
        # do to them.
        f"(+del ~{_PLAN} ~{spec_body('*')})",
    ],
    "worker": [
        *_COMMON,
        "+wait",  # a plan held by --store-replicas replicas before its build is announced (plans.RedisPlanStore)
        "+sismember",
        "+srem",  # an evicted plan off its spec's index (lifecycle.Janitor.remove)
        "+scard",
        "+hmget",
        "+hset",
        "+sadd",
        "+set",
        "+get",
        "+del",
        "+pexpire",
        "+expire",
        "+lpush",
        "+ltrim",
        "+publish",
        "+xgroup|create",
        "+xreadgroup",
        "+xautoclaim",
        "+xclaim",
        "+xpending",
        "+xack",
        "+xdel",
        "+xadd",
        "+zadd",
        "+zremrangebyscore",
        "+zrem",
        "+zmscore",
        "+exists",
        "+hincrby",
        "+hget",
        "+hgetall",
        "+zrangebyscore",
        "+smembers",
        "+scan",
        "+zrange",
        "+rpush",
        "+lpop",
        "+lindex",
        "+llen",  # taking a warming item at the plan's cursor only when the list has one there (warm_queue)
        "+lrange",
        "+hlen",
        "+hdel",
        "+hmget",
        "+multi",
        "+exec",
        "+pexpire",
        f"~{_PLAN}",
        f"~{PLAN_INDEX}",
        f"~{WARMED_INDEX}",
        f"~{STORE_COUNTERS}",
        f"~{TARGETS_LAST_SEEN}",
        f"~{spec_index('*')}",
        f"~{_PER_PLAN['lease']}",
        f"~{_PER_PLAN['job']}",
        f"~{_PER_PLAN['wanted']}",  # read only, but a script's keys need write access (TAKE_IF_WANTED)
        f"~{_PER_PLAN['failed']}",
        f"~{_JOB_STREAMS}",
        f"~{workers('*')}",
        f"~{KNOWN_TARGETS}",
        f"%R~{drain('*')}",
        f"~{RECENT_FAILURES}",
        f"~{spec_body('*')}",
        f"%R~{plan_hits('*')}",
        f"~{PREFIX}:{{warm:*",
        f"~{WARM_TARGETS}",
        f"%R~{STATS_SCOPES}",
        f"%R~{TOP_HITS}",
    ],
}


def acl_setuser(role: str, user: str, password: str) -> list[str]:
    """The arguments of `ACL SETUSER` for one plancache role."""
    return [user, "reset", "on", f">{password}", *ACL_RULES[role]]
