"""The search algorithms: how each proposes a generation's children and which candidates it keeps.

    nsga2                   NSGA-II (Deb et al. 2002): parents by binary tournament on (front, crowding
                            distance); a child is a crossover of two parents (with the file's
                            probability) or a copy of one, then mutated once; the next population is
                            the best `population` of parents and children by non-dominated sorting
                            and crowding distance, over every objective
    regularized-evolution   Real et al. 2019: each child is a mutation of the best of `sample_size`
                            members drawn from the population (by score); children join the
                            population and the oldest members leave it (aging). Children of one
                            generation are drawn from the same population (the batched variant)
    random                  every child is drawn from the space uniformly, as the initial population

A child is kept only if it builds, meets the budget and is new (its identity not yet proposed):
up to TRIES breedings per child. Where every try gives a candidate already proposed, the child is
that candidate again, scored from the store and never retrained (a `duplicate`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from madsl.errors import MadslError
from madsl.search.candidates import Candidate, CandidateBuilder, Rejection
from madsl.search.config import SearchFile
from madsl.search.genome import Genome, from_data, random_genome
from madsl.search.nsga2 import rank_and_crowding, survivors, tournament
from madsl.search.operators import crossover, mutate
from madsl.search.state import SearchState

TRIES = 32  # breedings tried per child before it is taken as a duplicate
NO_FEASIBLE_AFTER = 100  # initial draws all over budget: no candidate meets the budget
INITIAL_DRAWS = 200  # plus 20 per member: the draws the initial population may take

Bred = tuple[Genome | None, list[str], str]  # a genome (None: no applicable operator), its parents, the operator


@dataclass
class Breeding:
    """What proposing needs: the search, the candidate builder, the state and the generator."""

    search: SearchFile
    builder: CandidateBuilder
    state: SearchState
    rng: Any
    known: set[str] = field(default_factory=set)  # identities proposed so far, this batch's included

    def __post_init__(self) -> None:
        self.known |= set(self.state.candidates)

    def vector(self, spec_hash: str) -> list[float]:
        return objective_vector(self.search, self.state, spec_hash)

    def score(self, spec_hash: str) -> float:
        score = self.state.candidates[spec_hash].get("score")
        return score if score is not None else -math.inf


def objective_vector(search: SearchFile, state: SearchState, spec_hash: str) -> list[float]:
    """A candidate's objectives, each minimised: the score negated (no score: +inf), then the totals."""
    record = state.candidates[spec_hash]
    score = record.get("score")
    totals = [float(record["totals"][q]) for q in search.objectives.minimize]
    return [-score if score is not None else math.inf] + totals


def proposal(candidate: Candidate, genome: Genome, parents: list[str], operator: str, duplicate: bool) -> dict:
    return {
        "id": candidate.spec_hash,
        "genome": genome.to_data(),
        "parents": parents,
        "operator": operator,
        "duplicate": duplicate,
        "candidate": candidate,
    }


def make_child(ctx: Breeding, breed: Callable[[], Bred]) -> dict | None:
    """One child: the first bred candidate that builds, meets the budget and is new; else the last
    known one bred (a duplicate); None where every try was rejected or no operator applied."""
    fallback = None
    for _ in range(TRIES):
        genome, parents, operator = breed()
        if genome is None:
            continue
        built = ctx.builder.build(genome)
        if isinstance(built, Rejection):
            ctx.state.counts["over_budget" if built.reason == "over budget" else "invalid"] += 1
            continue
        if built.spec_hash in parents:  # the operator changed nothing that matters: breed again
            ctx.state.counts["parent_returned"] += 1
            continue
        if built.spec_hash in ctx.known:
            fallback = proposal(built, genome, parents, operator, duplicate=True)
            continue
        ctx.known.add(built.spec_hash)
        return proposal(built, genome, parents, operator, duplicate=False)
    return fallback


def initial_population(ctx: Breeding) -> list[dict]:
    """`population` distinct candidates within budget, drawn uniformly; located errors where the
    budget rules out every candidate drawn, or the space holds too few."""
    algorithm = ctx.search.algorithm
    out: list[dict] = []
    limit = INITIAL_DRAWS + 20 * algorithm.population
    rejections: list[Rejection] = []
    for draw in range(1, limit + 1):
        genome = random_genome(ctx.search.space, ctx.rng)
        built = ctx.builder.build(genome)
        if isinstance(built, Rejection):
            rejections.append(built)
            ctx.state.counts["over_budget" if built.reason == "over budget" else "invalid"] += 1
            if not out and draw >= NO_FEASIBLE_AFTER:
                raise _none_feasible(ctx.search, rejections)
        elif built.spec_hash not in ctx.known:
            ctx.known.add(built.spec_hash)
            out.append(proposal(built, genome, [], "random", duplicate=False))
            if len(out) == algorithm.population:
                return out
    raise MadslError(
        f"algorithm.population: {algorithm.population} distinct candidates are asked for, and {limit:,} "
        f"draws from the space found {len(out)} within the budget",
        ctx.search.where("algorithm", "population"),
        hint="lower the population, or widen the space or the budget",
    )


def _none_feasible(search: SearchFile, rejections: list[Rejection]) -> MadslError:
    over = [r for r in rejections if r.reason == "over budget"]
    example = (over or rejections)[0]
    if over:  # located at the bound most of them break
        broken = Counter(q for r in over for q in r.quantities).most_common(1)[0][0]
        return MadslError(
            f"no candidate meets the budget: none of the {len(rejections)} candidates drawn from the "
            f"space does (e.g. {example.topology}: {example.message})",
            search.where("budget", broken),
            hint="widen the budget, name a free parameter under budget.fit, or narrow the space",
        )
    return MadslError(
        f"no candidate of the space is valid: none of the {len(rejections)} drawn is "
        f"(e.g. {example.topology}: {example.message})",
        search.where("space"),
        hint="check space.hyperparameters against the layers' rules",
    )


def random_children(ctx: Breeding, count: int) -> list[dict]:
    def breed() -> Bred:
        return random_genome(ctx.search.space, ctx.rng), [], "random"

    return children(ctx, count, breed)


def evolution_children(ctx: Breeding, count: int) -> list[dict]:
    """Regularized evolution: a tournament of `sample_size` members, the best mutated."""
    population = ctx.state.population

    def breed() -> Bred:
        drawn = ctx.rng.choice(len(population), ctx.search.algorithm.sample_size, replace=False)
        parent = max((population[int(i)] for i in drawn), key=lambda m: ctx.score(m["id"]))
        return mutated(ctx, from_data(parent["genome"]), [parent["id"]], "")

    return children(ctx, count, breed)


def nsga2_children(ctx: Breeding, count: int) -> list[dict]:
    """NSGA-II: binary tournaments on (front, crowding), crossover with the file's probability, one mutation."""
    population = ctx.state.population
    rank, crowding = rank_and_crowding([ctx.vector(m["id"]) for m in population])

    def breed() -> Bred:
        first = population[tournament(rank, crowding, ctx.rng)]
        genome, parents, operator = from_data(first["genome"]), [first["id"]], ""
        if ctx.rng.random() < ctx.search.algorithm.crossover:
            second = population[tournament(rank, crowding, ctx.rng)]
            bred = crossover(genome, from_data(second["genome"]), ctx.search.space, ctx.rng)
            if bred is not None:
                genome, parents, operator = bred, [first["id"], second["id"]], "crossover+"
        return mutated(ctx, genome, parents, operator)

    return children(ctx, count, breed)


def mutated(ctx: Breeding, genome: Genome, parents: list[str], prefix: str = "") -> Bred:
    """`genome` mutated once (its operator after `prefix`, e.g. "crossover+"); where no mutation
    applies, the genome as it is under the prefix's operator, or (None, ...) without one."""
    changed = mutate(genome, ctx.search.space, ctx.rng)
    if changed is None:
        return (genome, parents, prefix.rstrip("+")) if prefix else (None, parents, "")
    return changed[0], parents, prefix + changed[1]


def children(ctx: Breeding, count: int, breed: Callable[[], Bred]) -> list[dict]:
    """`count` children, each the first of `breed`'s offers that builds, meets the budget and is
    new (make_child); where every offer is rejected, a fresh draw from the space."""
    out = []
    for _ in range(count):
        child = make_child(ctx, breed)
        if child is None:  # every try rejected: a fresh draw from the space instead
            child = make_child(ctx, lambda: (random_genome(ctx.search.space, ctx.rng), [], "random"))
        if child is None:
            raise MadslError(
                "no candidate within the budget could be proposed: every one of "
                f"{2 * TRIES} tries was over budget or invalid",
                ctx.search.where("budget"),
                hint="widen the budget or the space",
            )
        out.append(child)
    return out


PROPOSERS = {"nsga2": nsga2_children, "regularized-evolution": evolution_children, "random": random_children}


def _members(batch: list[dict]) -> list[dict]:
    return [{"id": p["id"], "genome": p["genome"]} for p in batch]


def evolution_population(search: SearchFile, state: SearchState, batch: list[dict]) -> list[dict]:
    """Regularized evolution's aging: the children join, the oldest leave. A re-proposed identity
    does not re-enter young with its cached (perhaps lucky) score: it keeps the age it had, and
    ages out with it."""
    members = _members(batch)
    kept = [m for m, p in zip(members, batch) if not p["duplicate"]]
    return (state.population + kept)[-search.algorithm.population :]


def nsga2_population(search: SearchFile, state: SearchState, batch: list[dict]) -> list[dict]:
    """NSGA-II's survivors: the best `population` of members and children by non-dominated sorting
    and crowding distance, over every objective."""
    size, members = search.algorithm.population, _members(batch)
    if not state.population:
        return members[-size:]
    pool = list({m["id"]: m for m in state.population + members}.values())  # each identity once
    return [pool[i] for i in survivors([objective_vector(search, state, m["id"]) for m in pool], size)]


def random_population(search: SearchFile, state: SearchState, batch: list[dict]) -> list[dict]:
    """Random search keeps the best scores so far (its children do not depend on them)."""
    size, members = search.algorithm.population, _members(batch)
    if not state.population:
        return members[-size:]
    pool = list({m["id"]: m for m in state.population + members}.values())
    vectors = [objective_vector(search, state, m["id"]) for m in pool]
    order = sorted(range(len(pool)), key=lambda i: vectors[i][0])
    return [pool[i] for i in order[:size]]


SURVIVORS = {"nsga2": nsga2_population, "regularized-evolution": evolution_population, "random": random_population}


def next_population(search: SearchFile, state: SearchState, batch: list[dict]) -> list[dict]:
    """The members kept after a generation's batch is scored, by the search file's algorithm."""
    return SURVIVORS[search.algorithm.name](search, state, batch)
