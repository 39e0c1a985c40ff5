"""Genome -> candidate: canonicalised, checked, solved into the budget and accounted, before any
training; or the reason it is rejected.

A candidate is a spec: the search file's shared fields (width, layers, budget) with the genome's
topology and hyperparameters. It is checked by the spec loader (madsl.lang.spec), solved where the
search file names free parameters (`budget.fit`: as `madsl eval` trains a spec that asks for a fit,
madsl.fit.fitted, over the free parameters of the symbols it uses), accounted (madsl.graph) and
held to the budget. Its identity is its spec's hash (`Spec.hash`, what the runner files runs under):
two genomes that build one model are one candidate, scored once.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any

from madsl.errors import MadslError
from madsl.fit import fitted
from madsl.graph import account
from madsl.lang.budget import Bound, check
from madsl.lang.spec import Spec, spec_from_data
from madsl.search.config import FILL, FILLED, SearchFile
from madsl.search.genome import Genome


@dataclass(frozen=True)
class Candidate:
    spec_hash: str  # the runner's identity of its model: its runs are filed under it
    name: str
    topology: str  # canonical, as `madsl compile` prints it
    spec_data: dict[str, Any]  # the spec as written to a .mad file: solved values, no fit
    totals: dict[str, int]
    solved: dict[str, int]  # free parameters set to meet the budget ({} where none was needed)
    spec: Spec = field(compare=False, repr=False)


@dataclass(frozen=True)
class Rejection:
    reason: str  # "over budget" or "invalid"
    message: str
    topology: str
    quantities: tuple[str, ...] = ()  # the budget quantities it breaks


class CandidateBuilder:
    """Builds candidates of one search file, each at most once per process (a cache by topology
    and hyperparameters: evolution proposes the same genome again and again)."""

    def __init__(self, search: SearchFile):
        self.search = search
        self.cache: dict[tuple, Candidate | Rejection] = {}

    def build(self, genome: Genome) -> Candidate | Rejection:
        key = (genome.text(), genome.params)
        if key not in self.cache:
            self.cache[key] = self._build(genome)
        return self.cache[key]

    def _build(self, genome: Genome) -> Candidate | Rejection:
        return self.build_topology(genome.text(), genome.params)

    def build_topology(self, text: str, params: tuple[tuple[str, Any], ...] = ()) -> Candidate | Rejection:
        """The candidate of topology `text` with hyperparameters `params` (a genome's, or a
        reference design's: the search file's `references:`), built as every candidate is."""
        data = candidate_data(self.search, text, params)
        try:
            spec = spec_from_data(data)
            used = set(spec.symbols_used())
            free = [item for item in self.search.free if item.partition(".")[0] in used]
            fill = dict(params).get(FILL, 1.0)
            solved_spec, solution = (
                fitted(replace(spec, fit=free, budget=filled(spec.budget, fill))) if free else (spec, None)
            )
            totals = account(solved_spec, seq_len=spec.budget_seq_len).totals
        except MadslError as err:  # a hyperparameter value the layer refuses in this combination
            return Rejection("invalid", "; ".join(e.message for e in err.diagnostics), text)
        violations = check(totals, spec.budget)
        if violations:
            return Rejection(
                "over budget",
                "; ".join(v.message() for v in violations),
                spec.canonical(),
                tuple(v.quantity for v in violations),
            )
        solved = dict(solution.values) if solution is not None else {}
        final = _solved(data, solved)
        final_spec = spec_from_data(final) if solved else spec  # unsolved, `final` is `data`: parsed once
        spec_hash = final_spec.hash
        name = f"{self.search.name}-{spec_hash[:8]}"
        canonical = final_spec.canonical()
        final["name"], final["topology"] = name, canonical
        return Candidate(spec_hash, name, canonical, final, dict(totals), solved, replace(final_spec, name=name))


def candidate_data(
    search: SearchFile, text: str, params: tuple[tuple[str, Any], ...] | dict[str, Any]
) -> dict[str, Any]:
    """A candidate's spec data before solving: the search's shared fields, the topology `text`, the
    hyperparameters `params` under layers:, the budget without fit:."""
    data = copy.deepcopy(search.spec_data)
    layers = data.get("layers") or {}
    for name, value in dict(params).items():
        if name == FILL:  # the fraction the free parameters are solved toward: no layer's
            continue
        symbol, _, param = name.partition(".")
        layers.setdefault(symbol, {})[param] = value
    if layers:
        data["layers"] = layers
    if isinstance(data.get("budget"), dict):
        data["budget"] = {k: v for k, v in data["budget"].items() if k != "fit"}
        if not data["budget"]:
            del data["budget"]
    return {"name": search.name, **data, "topology": text}


def filled(budget: dict[str, Bound], fill: float) -> dict[str, Bound]:
    """The budget a candidate is solved toward: each state bound (FILLED) at `fill` of its upper
    end (a candidate solved there meets the budget itself), the others as written."""
    if fill >= 1:
        return budget
    out = dict(budget)
    for quantity in FILLED:
        bound = out.get(quantity)
        if bound is not None and math.isfinite(bound.high):
            high = bound.high * fill
            out[quantity] = Bound(min(bound.low, high), high, f"{fill:g} x ({bound.text})")
    return out


def _solved(data: dict[str, Any], solved: dict[str, int]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for name, value in solved.items():
        symbol, _, param = name.partition(".")
        out.setdefault("layers", {}).setdefault(symbol, {})[param] = value
    return out
