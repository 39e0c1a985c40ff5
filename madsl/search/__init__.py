"""Architecture search (`madsl search`, docs/search.md): evolve topologies inside a space, under
budgets, scored on the MAD tasks by the runner; resumable, and never training an identity twice.

Its modules, one concern each (data flows down the list; nothing here imports the command line):

    config.py         what a search file says, as checked data: Space, Objectives, Algorithm, SearchFile
    reading.py        search files (YAML) -> SearchFile, every error located; reading_space.py: the space
    genome.py         a candidate before it is built: its shape and blocks as topology nodes
    operators.py      mutations and crossover, on topology nodes
    candidates.py     genome -> candidate: checked, solved into the budget, accounted; its identity
    nsga2.py          non-dominated sorting, crowding distance, tournaments, survivors
    algorithms.py     NSGA-II, regularized evolution, random search: proposing and selecting
    evaluation.py     scoring batches through madsl.runner.api.evaluate
    state.py          the saved state a search resumes from; state_check.py the one gate it passes
                      (state_values.py: the checks of its values)
    ask_tell.py       the search asked for candidates and told their results (Search)
    proposers.py      the Proposer protocol, the file's algorithms as proposers
    loop.py           run_search and plan_search (the dry run): the search driven by the runner
    hypervolume.py    the hypervolume of a front, each generation's
    record.py         the front, the lineage, the JSON record, the .mad files; figures.py: the figures

The library interface (docs/search.md#library-interface), imported on first use (the command line
reads search files without loading the runner):

    Search, Proposal          ask_tell.py: the search asked for candidates and told their results
    Proposer, BuiltinProposer proposers.py: what proposes children and keeps the population
    Breeding                  algorithms.py: what a proposer breeds with
    run_search, plan_search   loop.py: the search driven by the runner; its dry run
    load_search               reading.py: a search file, checked

and madsl.search.hypervolume.hypervolume(points, reference), the hypervolume of a front.
"""

from __future__ import annotations

import importlib
from typing import Any

EXPORTS = {
    "Search": "madsl.search.ask_tell",
    "Proposal": "madsl.search.ask_tell",
    "Proposer": "madsl.search.proposers",
    "BuiltinProposer": "madsl.search.proposers",
    "Breeding": "madsl.search.algorithms",
    "run_search": "madsl.search.loop",
    "plan_search": "madsl.search.loop",
    "load_search": "madsl.search.reading",
}
__all__ = list(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module 'madsl.search' has no attribute {name!r}")
    return getattr(importlib.import_module(EXPORTS[name]), name)
