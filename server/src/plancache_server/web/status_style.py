"""The status page's style sheet (plancache_server.web.status_page): one
inline block, so the page needs no asset. Laid out for a 1440 px window
with no column cut and a 390 px phone (tables scroll inside their section,
their first column kept in view; charts shrink to the width)."""

CSS = """
:root {
  --fg:#1d2330; --muted:#6b7385; --line:#e3e6ec; --accent:#2f6fdf; --bar:#d5dbe6; --bad:#c8372d; --ok:#1f8a4c;
  --bg:#f7f8fa;
}
* { box-sizing: border-box; }
body {
  margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
  color: var(--fg); background: var(--bg);
}
header {
  background: #141a26; color: #fff; padding: 14px 28px;
  display: flex; align-items: baseline; gap: 18px; flex-wrap: wrap;
}
header h1 { font-size: 20px; margin: 0; letter-spacing: .3px; }
header .meta { color: #b8c0d0; font-size: 13px; }
header a { color: #9cc2ff; }
header a.current { color: #fff; font-weight: 600; text-decoration: none; border-bottom: 2px solid #9cc2ff; }
main { padding: 8px 28px 28px; max-width: 1500px; }
section {
  background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px 14px; margin-top: 16px;
  overflow-x: auto;
}
th:first-child, td:first-child { position: sticky; left: 0; background: #fff; z-index: 1; }
code.target { white-space: normal; word-break: break-all; display: inline-block; max-width: 17em; }
td.reason, td code.engine { white-space: normal; word-break: break-word; }
.summary { margin: 0 0 10px; }
.summary strong { font-size: 18px; }
@media (max-width: 700px) {
  header { padding: 10px 12px; gap: 8px; }
  header h1 { font-size: 17px; }
  main { padding: 2px 8px 16px; }
  section { padding: 10px 10px 12px; margin-top: 10px; }
  th, td { padding: 4px 8px 4px 0; }
  code.target { max-width: 11em; min-width: 9em; }
}
h2 { font-size: 15px; margin: 0 0 10px; }
table { border-collapse: collapse; width: 100%; }
th, td {
  text-align: left; padding: 5px 10px 5px 0; border-bottom: 1px solid var(--line);
  vertical-align: top; white-space: nowrap;
}
th { color: var(--muted); font-weight: 600; font-size: 12px; white-space: normal; vertical-align: bottom; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.reason {
  white-space: normal; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px;
  word-break: break-word;
}
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
.empty { color: var(--muted); font-style: italic; }
.hint { color: var(--muted); font-size: 0.85em; max-width: 32em; white-space: normal; }
.muted { color: var(--muted); }
.rate-good { color: var(--ok); font-weight: 600; }
.rate-poor { color: var(--bad); font-weight: 600; }
.tag { display: inline-block; padding: 0 6px; border-radius: 4px; font-size: 12px; }
.tag.rejected { background: #fde8e6; color: var(--bad); }
.tag.failed { background: #fff2d6; color: #8a5a00; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(620px, 100%), 1fr)); gap: 0 24px; }
svg.chart { width: 100%; max-width: 760px; height: auto; }
figure { margin: 6px 0 12px; }
figcaption { font-size: 13px; margin-bottom: 2px; }
svg text { font-size: 11px; fill: var(--muted); }
svg .gridline { stroke: var(--line); }
svg .lookups { fill: var(--bar); }
svg .rate { fill: none; stroke: var(--accent); stroke-width: 2; }
svg .point { fill: var(--accent); }
.legend { font-size: 12px; color: var(--muted); }
.legend .swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px; vertical-align: -1px; }
"""
