"""What operators read over HTTP: Prometheus collectors read at scrape time
(metrics), the status report (status) and page (status_page: jinja2
templates in web/templates, autoescaped, with the filters of status_format
and the charts' geometry of status_chart), the small HTTP server that
serves them (http).

Owns: the operators' view; nothing serves or builds through it.
May import: plancache, plancache_server.store, plancache_server.gateway, plancache_server.telemetry,
plancache_server.settings.
"""
