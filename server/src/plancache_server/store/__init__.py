"""The Redis schema both sides share: every key name (keys), the plans
(plans), job streams (jobs), builds' leases and outcomes (build_records),
the plans' lifecycle (lifecycle), statistics (stats) and what nodes report
of their graphs (fleet), the targets known and their workers (directory),
warming plans (warming, with warm_plans, warm_queue, warm_progress and
warm_items), connections (redis_conn) and what a process checks of them at
start (redis_checks), the private redis-server (embedded_redis) and the
repair of its files (repair).

Owns: what Redis holds, and how to read and write it; nothing about serving
or building.
May import: plancache, plancache_server.store, plancache_server.telemetry.
"""
