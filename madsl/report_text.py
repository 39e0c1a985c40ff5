"""Human and machine renderings of accounts and budget checks (rich tables, JSON, DOT)."""

from __future__ import annotations

import json
from typing import Any

from .graph import Account
from .lang.budget import Violation


def human(n: float) -> str:
    """1234567 -> '1.23M' (exact values go in JSON; tables are for reading)."""
    n = float(n)
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def params_quote(params: float, active_params: float) -> str:
    """A parameter count as models are quoted: '1.2B', or '30.5B-A3.3B' where a token reads
    fewer parameters than the model has (routed experts): total, then the active ones."""

    def short(n: float) -> str:
        return human(n).replace("G", "B")  # parameter counts are quoted in B, not G

    return short(params) if active_params == params else f"{short(params)}-A{short(active_params)}"


def routed(account: Account) -> bool:
    """True where some layer's token reads fewer parameters than the layer has (MoE, He)."""
    return any(row.active_params != row.params for row in account.layers)


# the state quantities whose violated budget highlights the layers holding some (every layer has
# parameters and FLOPs: highlighting them all would show nothing)
_LAYER_QUANTITIES = ("fixed_state", "conv_state", "kv_cache")


def _add_columns(table, account: Account, violated: set[str], with_active: bool) -> None:
    """The layer table's columns, each quantity's total in its footer (red where violated)."""
    totals = account.totals
    columns = (
        [("#", None), ("layer", None), ("primitive", None), ("params", "params")]
        + ([("active params", "active_params")] if with_active else [])
        + [
            ("fixed state", "fixed_state"),
            ("conv state", "conv_state"),
            (f"KV cache @{account.seq_len}", "kv_cache"),
            ("FLOPs", "flops"),
        ]
    )
    for header, quantity in columns:
        footer = ""
        if quantity:
            footer = f"{totals[quantity]:,}"
            if quantity in violated:
                footer = f"[bold red]{footer}[/]"
        elif header == "layer":
            footer = "total"
        table.add_column(header, footer=footer, justify="right" if quantity or header == "#" else "left")


def _init_mark(account: Account, row: Any) -> str:
    """' (init)' or ' (init, frozen)' after a row the spec's `init:` gives saved weights."""
    if not account.initialised(row):
        return ""
    return " (init, frozen)" if account.initialised(row, frozen=True) else " (init)"


def account_table(account: Account, violations: list[Violation] | None = None):
    """The layer table of `madsl compile`: a row per layer and model-level part, totals in the
    footer; its title quotes the parameters ('226k-A109k params' where experts are routed, with
    an `active params` column showing each routed layer's active count)."""
    from rich.table import Table

    violated = {v.quantity for v in violations or []}
    spec = account.spec
    totals = account.totals
    title = (
        f"{spec.name}: {spec.canonical()}  (dim {spec.dim}, L={account.seq_len}"
        + (f", vocab {account.vocab}" if account.vocab else ", no vocab")
        + f"; {params_quote(totals['params'], totals['active_params'])} params"
        + (
            f", {params_quote(totals['frozen_params'], totals['frozen_params'])} frozen"
            if "frozen_params" in totals
            else ""
        )
        + ")"
    )
    table = Table(title=title, title_justify="left", show_footer=True)
    with_active = routed(account)
    _add_columns(table, account, violated, with_active)
    for row in account.layers:
        symbol = row.symbol + (f"#{row.tag}" if row.tag else "") + (" (shared)" if row.shared else "")
        symbol += _init_mark(account, row)
        # highlight the layers that contribute to a violated quantity
        style = "red" if any(getattr(row, q) for q in violated if q in _LAYER_QUANTITIES) else None
        active = [f"{row.active_params:,}" if row.active_params != row.params else ""] if with_active else []
        table.add_row(
            str(row.index),
            symbol,
            row.primitive,
            f"{row.params:,}",
            *active,
            f"{row.fixed_state:,}",
            f"{row.conv_state:,}",
            f"{row.kv_cache:,}",
            f"{row.flops:,}",
            style=style,
        )
    for part in account.parts:
        table.add_row(
            "",
            part.name + _init_mark(account, part),
            "",
            f"{part.params:,}",
            *([""] if with_active else []),
            "",
            "",
            "",
            f"{part.flops:,}" if part.flops else "",
            style="dim",
        )
    return table


def account_json(account: Account, violations: list[Violation] | None = None) -> dict[str, Any]:
    out = account.as_dict()
    out["budget"] = {q: {"bound": b.text, "ok": b.contains(out["totals"][q])} for q, b in account.spec.budget.items()}
    out["ok"] = not violations
    return out


def account_dot(account: Account) -> str:
    """Graphviz DOT of the architecture graph."""
    lines = [f'digraph "{account.spec.name}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for node, data in account.graph.nodes(data=True):
        kind = data.get("kind")
        if kind == "layer":
            row = data["row"]
            label = f"{row.symbol}\\n{row.primitive}\\n{row.params:,} params"
            if row.active_params != row.params:  # a routed layer: what one token reads
                label += f"\\n{row.active_params:,} active"
            if row.fixed_state:
                label += f"\\nstate {row.fixed_state:,}"
            lines.append(f'  "{node}" [label="{label}"];')
        elif kind in ("add", "sum"):
            lines.append(f'  "{node}" [label="+", shape=circle];')
        else:
            lines.append(f'  "{node}" [label="{node}", shape=ellipse];')
    styles = {"residual": "dashed", "branch": "solid", "group": "bold", "shares": "dotted", "data": "solid"}
    for a, b, data in account.graph.edges(data=True):
        lines.append(f'  "{a}" -> "{b}" [style={styles.get(data.get("kind"), "solid")}];')
    lines.append("}")
    return "\n".join(lines)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)
