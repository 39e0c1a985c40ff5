"""The page's frame: its style and script (inline: the page loads nothing), sortable tables and cells.

Sorting: a click on (or Enter in) a column header of a `table.sortable` sorts its rows by that
column, numbers as numbers (a cell's `data-v` holds its exact value), empty cells last; a second
click reverses the order; the header's aria-sort says which.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Sequence

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1f24;background:#fafbfc}
header,main{max-width:1400px;margin:0 auto;padding:0 20px}
header{padding-top:14px}
h1{font-size:22px;margin:6px 0}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:16px 0 6px}
nav a{margin-right:14px}
.meta{color:#57606a}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
table.sortable th{cursor:pointer;user-select:none;background:#f0f3f6}
table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}
table.heat td.n{color:#000}
.charts{display:flex;flex-wrap:wrap;gap:14px}
figure.chart{margin:0;background:#fff;border:1px solid #d0d7de;padding:6px;max-width:440px}
figcaption{font-weight:600;font-size:13px;margin-bottom:2px}
svg .frame{fill:none;stroke:#8c959f}svg .grid{stroke:#eaeef2}
svg .tick{font-size:10px;fill:#57606a}svg .label{font-size:11px;fill:#24292f}
svg .star{font-size:15px;fill:#000}
ul.legend{list-style:none;padding:0;margin:4px 0 0;font-size:11px;columns:2}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:8px;overflow-x:auto;font-size:12px}
details>summary{cursor:pointer;margin:6px 0}
.empty{color:#57606a}
"""

SCRIPT = """
(function () {
  function key(cell) {
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent.trim(); }
    if (v === "") { return null; }
    var n = Number(v);
    return isNaN(n) ? v.toLowerCase() : n;
  }
  function compare(a, b) {
    if (a === null || b === null) { return a === b ? 0 : (a === null ? 1 : -1); }
    if (typeof a !== typeof b) { return typeof a === "number" ? -1 : 1; }
    return a < b ? -1 : (a > b ? 1 : 0);
  }
  function sortBy(table, th, col) {
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var heads = table.tHead.rows[0].cells;
    for (var i = 0; i < heads.length; i++) { heads[i].removeAttribute("aria-sort"); }
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var keyed = rows.map(function (row, i) { return [key(row.cells[col]), i, row]; });
    keyed.sort(function (x, y) {
      if (x[0] === null || y[0] === null) { return compare(x[0], y[0]) || x[1] - y[1]; }
      return (ascending ? compare(x[0], y[0]) : compare(y[0], x[0])) || x[1] - y[1];
    });
    var fragment = document.createDocumentFragment();
    keyed.forEach(function (k) { fragment.appendChild(k[2]); });
    body.appendChild(fragment);
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      th.title = "sort by " + th.textContent;
      th.addEventListener("click", function () { sortBy(table, th, col); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortBy(table, th, col); } });
    });
  });
  document.body.setAttribute("data-ready", "1");
})();
"""


def cell(value: Any, digits: int = 3) -> str:
    """A table cell: numbers right-aligned with their exact value in data-v; None empty."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '<td data-v=""></td>'
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, (int, float)):
        shown = (
            f"{value:,}" if isinstance(value, int) else f"{value:.{digits}f}" if abs(value) >= 1e-3 else f"{value:.3g}"
        )
        return f'<td class="n" data-v="{value!r}">{shown}</td>'
    return f"<td>{escape(str(value))}</td>"


def heat_cell(value: float | None) -> str:
    """A score in [0, 1] as a cell coloured from red (0) through yellow to green (1)."""
    if value is None or not math.isfinite(value):
        return '<td data-v=""></td>'
    v = min(max(value, 0.0), 1.0)
    hue = 120 * v
    return f'<td class="n" data-v="{value!r}" style="background:hsl({hue:.0f},70%,{78 - 10 * v:.0f}%)">{value:.3f}</td>'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], table_id: str, classes: str = "sortable") -> str:
    """A table of pre-rendered cells (cell(), heat_cell()), in a scrolling box."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return (
        f'<div class="scroll"><table id="{table_id}" class="{classes}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def document(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """The whole page: sections are (id, heading, body HTML)."""
    nav = "".join(f'<a href="#{sid}">{escape(heading)}</a>' for sid, heading, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{escape(heading)}</h2>{html}</section>' for sid, heading, html in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<header><h1>{escape(title)}</h1><p class="meta">{escape(subtitle)}</p><nav>{nav}</nav></header>'
        f"<main>{body}</main><script>{SCRIPT}</script></body></html>\n"
    )
