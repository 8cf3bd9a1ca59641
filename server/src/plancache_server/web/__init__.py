"""What operators read over HTTP: Prometheus collectors read at scrape time
(metrics), the status report and page (status, status_page), the small HTTP
server that serves them (http).

Owns: the operators' view; nothing serves or builds through it.
May import: plancache, plancache_server.store, plancache_server.gateway, plancache_server.telemetry,
plancache_server.settings.
"""
