"""The Proposer protocol: what a search algorithm is to the loop. NSGA-II, regularized evolution and
random search implement it (BuiltinProposer); a search takes any other object that does
(`Search(..., proposer=...)`, `run_search(..., proposer=...)`).

A proposer is asked for generations 1..G only: generation 0, the initial population, is drawn
uniformly from the space, the same for every algorithm of one seed. Its `propose` breeds through
the context (madsl.search.algorithms.Breeding: the search, the candidate builder, the state, the
search's random generator), so that every child is built, held to the budget and new, and the same
seed gives the same search; the helpers of madsl.search.algorithms (children, make_child, mutated,
proposal) do that. A search checks what a proposer returns (check_proposals, check_survivors)
before any of it enters the state, so a saved state always loads again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from madsl.errors import MadslError
from madsl.search.algorithms import PROPOSERS, SURVIVORS, Breeding
from madsl.search.candidates import Candidate
from madsl.search.config import SearchFile
from madsl.search.genome import from_data
from madsl.search.state import SearchState
from madsl.search.state_check import OPERATORS

PROPOSAL_KEYS = ("id", "genome", "parents", "operator", "duplicate", "candidate")


@runtime_checkable
class Proposer(Protocol):
    """Proposes each generation's children and chooses the population that survives it."""

    def propose(self, context: Breeding, count: int) -> list[dict[str, Any]]:
        """`count` proposals (madsl.search.algorithms.proposal: id, genome, parents, operator,
        duplicate, candidate), bred with `context.rng`."""
        ...

    def survivors(self, search: SearchFile, state: SearchState, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The population after `batch` is scored (its scores are in `state.candidates`): at most
        `search.algorithm.population` members {"id", "genome"} of the population and the batch."""
        ...


@dataclass(frozen=True)
class BuiltinProposer:
    """One of the search file's algorithms: `nsga2`, `regularized-evolution` or `random`."""

    name: str

    def propose(self, context: Breeding, count: int) -> list[dict[str, Any]]:
        return PROPOSERS[self.name](context, count)

    def survivors(self, search: SearchFile, state: SearchState, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return SURVIVORS[self.name](search, state, batch)


def proposer_for(search: SearchFile, proposer: Any = None) -> Any:
    """The proposer a search uses: `proposer` where given (an object with propose and survivors),
    else the search file's algorithm."""
    if proposer is None:
        return BuiltinProposer(search.algorithm.name)
    if not isinstance(proposer, Proposer):
        raise MadslError(
            f"{type(proposer).__name__} is not a proposer",
            hint="give an object with propose(context, count) and survivors(search, state, batch)",
        )
    return proposer


def _refused(proposer: Any, what: str) -> MadslError:
    return MadslError(
        f"proposer {type(proposer).__name__}: {what}",
        hint="breed through madsl.search.algorithms (children, make_child, mutated, proposal)",
    )


def check_proposals(proposer: Any, context: Breeding, known: set[str], batch: Any, count: int) -> None:
    """A proposer's batch, checked before it enters the state: `count` proposals, each the
    candidate its genome builds, with known parents, an operator of the search, and marked a
    duplicate exactly where its identity was proposed before (`known`: the identities before it)."""
    if not isinstance(batch, list) or len(batch) != count:
        raise _refused(
            proposer,
            f"returned {type(batch).__name__} of {len(batch) if isinstance(batch, list) else '?'}"
            f" proposals; {count} were asked for",
        )
    seen = set(known)
    for index, item in enumerate(batch):
        where = f"proposal {index}"
        if not isinstance(item, dict) or set(item) != set(PROPOSAL_KEYS):
            raise _refused(proposer, f"{where} is not a proposal ({', '.join(PROPOSAL_KEYS)})")
        candidate = item["candidate"]
        if not isinstance(candidate, Candidate) or candidate.spec_hash != item["id"]:
            raise _refused(proposer, f"{where}: its candidate is not the one filed under its id")
        built = context.builder.build(from_data(item["genome"]))  # cached: the genome it came from
        if not isinstance(built, Candidate) or built.spec_hash != item["id"]:
            raise _refused(proposer, f"{where}: its genome does not build its candidate")
        parents, operator = item["parents"], item["operator"]
        if not isinstance(parents, list) or len(parents) > 2 or any(p not in context.state.candidates for p in parents):
            raise _refused(proposer, f"{where}: its parents are not candidates of the search")
        if not isinstance(operator, str) or any(part not in OPERATORS for part in operator.split("+")):
            known_operators = ", ".join(OPERATORS)
            raise _refused(proposer, f"{where}: {operator!r} is not an operator ({known_operators}, joined by '+')")
        if item["duplicate"] is not (item["id"] in seen):
            raise _refused(proposer, f"{where}: marked duplicate={item['duplicate']!r}, wrongly")
        seen.add(item["id"])


def check_survivors(proposer: Any, search: SearchFile, state: SearchState, members: Any) -> None:
    """A proposer's population, checked before it enters the state."""
    size = search.algorithm.population
    if not isinstance(members, list) or not 1 <= len(members) <= size:
        raise _refused(proposer, f"survivors() must return a list of 1 to {size} members")
    for member in members:
        if not isinstance(member, dict) or set(member) != {"id", "genome"} or member["id"] not in state.candidates:
            raise _refused(proposer, "a survivor is not a member {'id', 'genome'} of a candidate of the search")
