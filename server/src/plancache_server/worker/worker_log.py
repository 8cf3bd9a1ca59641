"""The compile worker's log, shared by its modules: one logger and one
limiter of repeated faults.

The logger keeps the name the worker's lines have always had
(plancache_server.worker.worker); one limiter makes a Redis outage met by
the loop and by a plan being stored one line a minute, not two.
"""

from __future__ import annotations

import logging

from plancache.log_limits import LogLimiter

log = logging.getLogger("plancache_server.worker.worker")
# A Redis outage or a dying build process is met over and over: one line a minute per kind.
faults = LogLimiter(log)
