"""What operators read over HTTP: Prometheus collectors read at scrape time
(metrics), the status report (status) and page (status_page, with its
sections' modules status_fleet and status_chart, its cells in status_html
and its style sheet in status_style), the small HTTP server that serves
them (http).

Owns: the operators' view; nothing serves or builds through it.
May import: plancache, plancache_server.store, plancache_server.gateway, plancache_server.telemetry,
plancache_server.settings.
"""
