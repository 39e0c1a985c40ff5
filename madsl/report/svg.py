"""Small charts as inline SVG text, with no plotting library: lines (a sweep, a curve, IsoFLOP
profiles) and points (a search's front). Linear or log axes, a tick every nice step, a legend, and
each point's value in a <title> (shown on hover). The markup carries no namespace URL: inline SVG
in HTML needs none, and the page holds no network address.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
Point = tuple[float, float]
MARGIN = (52, 16, 28, 40)  # left, right, top, bottom


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= m * step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """The exponents of the powers of ten in [lo, hi] (log10 units)."""
    exponents = [float(e) for e in range(math.floor(lo), math.ceil(hi) + 1) if lo - 1e-9 <= e <= hi + 1e-9]
    return exponents or [lo]


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:.4g}"


class Axes:
    """A plot area mapping data to pixels, linear or log on either axis."""

    def __init__(self, points: Sequence[Point], width: int, height: int, logx: bool, logy: bool):
        self.width, self.height, self.logx, self.logy = width, height, logx, logy
        xs = [self.tx(x) for x, _ in points] or [0.0, 1.0]
        ys = [self.ty(y) for _, y in points] or [0.0, 1.0]
        pad_x = (max(xs) - min(xs)) * 0.04 or 0.5
        pad_y = (max(ys) - min(ys)) * 0.06 or 0.5
        self.x0, self.x1 = min(xs) - pad_x, max(xs) + pad_x
        self.y0, self.y1 = min(ys) - pad_y, max(ys) + pad_y

    def tx(self, x: float) -> float:
        return math.log10(x) if self.logx else x

    def ty(self, y: float) -> float:
        return math.log10(y) if self.logy else y

    def px(self, x: float) -> float:
        left, right = MARGIN[0], self.width - MARGIN[1]
        return left + (self.tx(x) - self.x0) / (self.x1 - self.x0) * (right - left)

    def py(self, y: float) -> float:
        top, bottom = MARGIN[2], self.height - MARGIN[3]
        return bottom - (self.ty(y) - self.y0) / (self.y1 - self.y0) * (bottom - top)

    def frame(self, xlabel: str, ylabel: str) -> list[str]:
        left, right, top, bottom = MARGIN[0], self.width - MARGIN[1], MARGIN[2], self.height - MARGIN[3]
        out = [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" class="frame"/>']
        xt = [10**t for t in _log_ticks(self.x0, self.x1)] if self.logx else _nice_ticks(self.x0, self.x1)
        yt = [10**t for t in _log_ticks(self.y0, self.y1)] if self.logy else _nice_ticks(self.y0, self.y1)
        for x in xt:
            p = self.px(x)
            out.append(f'<line x1="{p:.1f}" x2="{p:.1f}" y1="{top}" y2="{bottom}" class="grid"/>')
            out.append(f'<text x="{p:.1f}" y="{bottom + 13}" class="tick" text-anchor="middle">{fmt(x)}</text>')
        for y in yt:
            p = self.py(y)
            out.append(f'<line x1="{left}" x2="{right}" y1="{p:.1f}" y2="{p:.1f}" class="grid"/>')
            out.append(f'<text x="{left - 4}" y="{p + 3:.1f}" class="tick" text-anchor="end">{fmt(y)}</text>')
        out.append(f'<text x="{(left + right) / 2}" y="{self.height - 6}" class="label" text-anchor="middle">')
        out.append(f"{escape(xlabel)}</text>")
        out.append(f'<text transform="translate(12 {(top + bottom) / 2}) rotate(-90)" class="label" ')
        out.append(f'text-anchor="middle">{escape(ylabel)}</text>')
        return out


def _legend(labels: Sequence[str], limit: int = 14) -> str:
    items = [
        f'<li><span class="swatch" style="background:{colour(i)}"></span>{escape(label)}</li>'
        for i, label in enumerate(labels[:limit])
    ]
    if len(labels) > limit:
        items.append(f"<li>and {len(labels) - limit} more (hover a line)</li>")
    return f'<ul class="legend">{"".join(items)}</ul>'


def _usable(points: Sequence[Point], logx: bool, logy: bool) -> list[Point]:
    return [
        (x, y)
        for x, y in points
        if math.isfinite(x) and math.isfinite(y) and (not logx or x > 0) and (not logy or y > 0)
    ]


def line_chart(
    series: Sequence[tuple[str, Sequence[Point]]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    logy: bool = False,
    width: int = 420,
    height: int = 280,
    marks: Sequence[tuple[str, Point]] = (),
) -> str:
    """A chart of one line per series (label, points); `marks` are starred points (label, point)."""
    clean = [(label, _usable(points, logx, logy)) for label, points in series]
    clean = [(label, points) for label, points in clean if points]
    every = [p for _, points in clean for p in points]
    if not every:
        return f'<figure class="chart"><figcaption>{escape(title)}</figcaption><p class="empty">no data</p></figure>'
    axes = Axes(every, width, height, logx, logy)
    body = axes.frame(xlabel, ylabel)
    for i, (label, points) in enumerate(clean):
        path = " ".join(f"{axes.px(x):.1f},{axes.py(y):.1f}" for x, y in points)
        body.append(f'<g class="series"><title>{escape(label)}</title>')
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour(i)}" stroke-width="1.6"/>')
        for x, y in points:
            body.append(
                f'<circle cx="{axes.px(x):.1f}" cy="{axes.py(y):.1f}" r="2.4" fill="{colour(i)}">'
                f"<title>{escape(label)}: {fmt(x)}, {fmt(y)}</title></circle>"
            )
        body.append("</g>")
    for label, (x, y) in marks:
        if _usable([(x, y)], logx, logy):
            body.append(
                f'<text x="{axes.px(x):.1f}" y="{axes.py(y) + 5:.1f}" class="star" text-anchor="middle">&#9733;'
                f"<title>{escape(label)}</title></text>"
            )
    svg = f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">{"".join(body)}</svg>'
    return (
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{svg}'
        f"{_legend([label for label, _ in clean])}</figure>"
    )


def scatter_chart(
    points: Sequence[tuple[float, float, str, bool]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    width: int = 420,
    height: int = 280,
) -> str:
    """Points (x, y, label, highlighted): highlighted ones drawn large and joined (a front)."""
    clean = [p for p in points if _usable([(p[0], p[1])], logx, False)]
    if not clean:
        return f'<figure class="chart"><figcaption>{escape(title)}</figcaption><p class="empty">no data</p></figure>'
    axes = Axes([(x, y) for x, y, _, _ in clean], width, height, logx, False)
    body = axes.frame(xlabel, ylabel)
    front = sorted((x, y) for x, y, _, on in clean if on)
    if len(front) > 1:
        path = " ".join(f"{axes.px(x):.1f},{axes.py(y):.1f}" for x, y in front)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour(3)}" stroke-width="1.2"/>')
    for x, y, label, on in clean:
        fill, radius = (colour(3), 4.5) if on else (colour(0), 2.8)
        body.append(
            f'<circle cx="{axes.px(x):.1f}" cy="{axes.py(y):.1f}" r="{radius}" fill="{fill}" fill-opacity="0.8">'
            f"<title>{escape(label)}: {fmt(x)}, {fmt(y)}</title></circle>"
        )
    svg = f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">{"".join(body)}</svg>'
    legend = '<ul class="legend"><li><span class="swatch" style="background:#d62728"></span>the front</li></ul>'
    return f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{svg}{legend}</figure>'
