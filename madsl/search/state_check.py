"""The one gate a saved search state passes before any of it is used: `load_state`.

The state file is data anyone may have edited, truncated or written by hand, so it is checked
whole, cheapest checks first, and refused whole at the first problem (MadslError located at the
state file, naming the field as a JSON path, e.g. `candidates["ab12..."].spec`):

- every field's type and range: the generation within the search's, counts non-negative and no
  more than the search can make, the history one entry per finished generation, the generator
  state one numpy takes;
- caps before any expansion: no more candidates than the algorithm proposes, population and
  batch sizes the algorithm's, every genome's shape, size, blocks and hyperparameters within the
  space, by arithmetic (a motif `count: 1e12` is refused before a block of it is built);
- identities recomputed: each candidate's spec is the search's shared fields with values of the
  space, its name the one madsl makes from its hash (a safe file name), and it is loaded again
  (spec_from_data), its hash compared with the key it is filed under, its topology and totals
  with those it claims, its totals held to the budget; each member of the population and of the
  pending batch is a candidate of the state, its genome building that candidate's topology.

Each candidate is loaded and accounted once (about 1.5 ms of CPU a candidate of a few blocks:
15 s for a state of 10,000), and its spec kept for the loop (`StateCheck.specs`), which loads
none of them again.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from madsl.errors import MadslError
from madsl.graph import account
from madsl.lang import topology as topo
from madsl.lang.budget import check
from madsl.lang.spec import Spec, spec_from_data
from madsl.search.algorithms import INITIAL_DRAWS, TRIES
from madsl.search.candidates import candidate_data
from madsl.search.config import FILL, Hyperparameter, SearchFile
from madsl.search.genome import from_data
from madsl.search.operators import MUTATIONS
from madsl.search.state import SearchState, read_state
from madsl.search.state_values import StateValues, json_key, shown

FIELDS = ("fingerprint", "generation", "rng", "population", "pending", "candidates", "history", "counts", "complete")
RECORD = (
    "id",
    "name",
    "topology",
    "generation",
    "parents",
    "operator",
    "totals",
    "solved",
    "spec",
    "status",
    "score",
    "tasks",
)
HISTORY = (
    "generation",
    "proposed",
    "new",
    "duplicates",
    "failed",
    "best",
    "median",
    "best_so_far",
    "trained",
    "reused",
)
COUNTS = ("over_budget", "invalid", "duplicates")
LATER_COUNTS = ("parent_returned",)  # kept since a later version: a state saved before has none (0)
STATUSES = ("pending", "scored", "failed")
OPERATORS = ("random", "crossover", *MUTATIONS)  # an operator is these joined by "+" (crossover+insert)
SPEC_HASH = re.compile(r"[0-9a-f]{64}")
MAX_TASKS = 256  # task scores of a candidate
MAX_TEXT = 65_536  # characters of a topology (madsl.lang.topology's own limit)
MAX_RUNS = 2**53  # runs trained or reused in a generation: any count JSON holds exactly


def load_state(path: Path, search: SearchFile) -> tuple[SearchState, dict[str, Spec]] | None:
    """The saved state of `search` at `path` (None where there is none yet), checked whole, and
    each candidate's spec as loaded again (by spec hash)."""
    data = read_state(Path(path), search.fingerprint())
    if data is None:
        return None
    checker = StateCheck(search, Path(path))
    return checker.state(data), checker.specs


def _allowed(hyper: Hyperparameter, value: Any) -> bool:
    if hyper.choices:  # 1, 1.0 and true are three values
        return any(value == choice and type(value) is type(choice) for choice in hyper.choices)
    return isinstance(value, int) and not isinstance(value, bool) and hyper.low <= value <= hyper.high


class StateCheck(StateValues):
    """Checks one state's data against one search (see the module docstring)."""

    def __init__(self, search: SearchFile, path: Path):
        super().__init__(path)
        self.search = search
        self.specs: dict[str, Spec] = {}
        # the fields every candidate's spec shares, as a state holds them (through JSON)
        self.base = json.loads(json.dumps(candidate_data(search, "", ()), default=str))

    # --- the state -------------------------------------------------------------------------------

    def state(self, data: dict[str, Any]) -> SearchState:
        algorithm = self.search.algorithm
        self.mapping(data, "the file", ("format", "version") + FIELDS)
        generation = self.integer(data["generation"], "generation", 0, algorithm.generations + 1)
        if not isinstance(data["complete"], bool) or data["complete"] != (generation > algorithm.generations):
            raise self.fail(
                "complete",
                f"{shown(data['complete'])} at generation {generation} of {algorithm.generations}",
                expected="true after the last generation only",
            )
        self.counts(data["counts"])
        self.rng(data["rng"])
        self.history(data["history"], generation)
        candidates = data["candidates"]
        if not isinstance(candidates, dict):
            raise self.fail("candidates", f"expected an object, got {type(candidates).__name__}")
        if len(candidates) > algorithm.evaluations:
            raise self.fail("candidates", f"holds {len(candidates):,}; this search proposes {algorithm.evaluations:,}")
        for key, record in candidates.items():
            self.record(key, record, candidates, generation)
        members = self.members(data, generation)
        for key, record in candidates.items():
            self.identity(key, record)
        for where, member in members:
            self.genome_builds(where, member, candidates[member["id"]])
        return SearchState(**{key: data[key] for key in FIELDS})

    def counts(self, counts: Any) -> None:
        a = self.search.algorithm
        self.mapping(counts, "counts", COUNTS, LATER_COUNTS)
        rejected = INITIAL_DRAWS + 20 * a.population + 2 * TRIES * a.offspring * a.generations  # every draw made
        for key in LATER_COUNTS:
            counts.setdefault(key, 0)
        for key in COUNTS + LATER_COUNTS:
            most = a.offspring * a.generations if key == "duplicates" else rejected
            self.integer(counts[key], f"counts.{key}", 0, most)

    def rng(self, value: Any) -> None:
        self.mapping(value, "rng", ("bit_generator", "state", "has_uint32", "uinteger"))
        if value["bit_generator"] != "PCG64":
            raise self.fail("rng.bit_generator", f"{shown(value['bit_generator'])}", expected="PCG64")
        inner = self.mapping(value["state"], "rng.state", ("state", "inc"))
        for key in ("state", "inc"):
            self.integer(inner[key], f"rng.state.{key}", 0, 2**128 - 1)
        self.integer(value["has_uint32"], "rng.has_uint32", 0, 1)
        self.integer(value["uinteger"], "rng.uinteger", 0, 2**32 - 1)
        try:
            np.random.PCG64().state = value
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            raise self.fail("rng", f"numpy refuses it as a generator state ({err})") from None

    def history(self, entries: Any, generation: int) -> None:
        self.listing(entries, "history", self.search.algorithm.generations + 1)
        if len(entries) != generation:
            raise self.fail(
                "history",
                f"holds {len(entries)} entries at generation {generation}",
                expected="one entry a finished generation",
            )
        most = max(self.search.algorithm.population, self.search.algorithm.offspring)
        for index, entry in enumerate(entries):
            where = f"history[{index}]"
            self.mapping(entry, where, HISTORY)
            self.integer(entry["generation"], f"{where}.generation", index, index)
            for key in ("proposed", "new", "duplicates", "failed"):
                self.integer(entry[key], f"{where}.{key}", 0, most)
            for key in ("trained", "reused"):
                self.integer(entry[key], f"{where}.{key}", 0, MAX_RUNS)
            for key in ("best", "median", "best_so_far"):
                self.number(entry[key], f"{where}.{key}")

    # --- candidates, as data -----------------------------------------------------------------------

    def record(self, key: Any, record: Any, candidates: dict, generation: int) -> None:
        where = f"candidates[{json_key(str(key))}]"
        if not SPEC_HASH.fullmatch(key):
            raise self.fail(where, "the key is not a spec hash", expected="64 hexadecimal digits")
        self.mapping(record, where, RECORD, ("proposed_again",))
        if record["id"] != key:
            raise self.fail(f"{where}.id", f"{shown(record['id'])} is not the key it is filed under")
        name = f"{self.search.name}-{key[:8]}"  # names are made, never read: a safe file name, as the search's is
        if record["name"] != name:
            raise self.fail(f"{where}.name", f"{shown(record['name'])} is not the candidate's name", expected=name)
        if not isinstance(record["topology"], str) or len(record["topology"]) > MAX_TEXT:
            raise self.fail(f"{where}.topology", f"{shown(record['topology'])} is not a topology")
        self.integer(record["generation"], f"{where}.generation", 0, generation)
        self.lineage(record, where, candidates)
        self.outcome(record, where)
        totals = record["totals"]
        if not isinstance(totals, dict) or not all(isinstance(k, str) for k in totals):
            raise self.fail(f"{where}.totals", "expected an object of accounted totals")
        for quantity, value in totals.items():
            self.integer(value, f"{where}.totals.{quantity}", 0)
        solved = record["solved"]
        if not isinstance(solved, dict) or any(k not in self.search.free for k in solved):
            raise self.fail(
                f"{where}.solved",
                f"{shown(solved)} names a parameter budget.fit does not",
                expected="free parameters of budget.fit: " + (", ".join(self.search.free) or "none"),
            )
        for name, value in solved.items():
            self.integer(value, f"{where}.solved[{json_key(name)}]", 0)
        if not isinstance(record["spec"], dict):
            raise self.fail(f"{where}.spec", f"expected an object, got {type(record['spec']).__name__}")
        again = self.search.algorithm.offspring * self.search.algorithm.generations
        for index, entry in enumerate(self.listing(record.get("proposed_again", []), f"{where}.proposed_again", again)):
            self.mapping(entry, f"{where}.proposed_again[{index}]", ("generation", "parents", "operator"))
            self.integer(entry["generation"], f"{where}.proposed_again[{index}].generation", 1, generation)
            self.lineage(entry, f"{where}.proposed_again[{index}]", candidates)

    def lineage(self, entry: dict, where: str, candidates: dict) -> None:
        for index, parent in enumerate(self.listing(entry["parents"], f"{where}.parents", 2)):
            if not isinstance(parent, str) or parent not in candidates:
                raise self.fail(f"{where}.parents[{index}]", f"{shown(parent)} is not a candidate of the state")
        operator = entry["operator"]
        if not isinstance(operator, str) or not operator or any(p not in OPERATORS for p in operator.split("+")):
            raise self.fail(
                f"{where}.operator",
                f"{shown(operator)} is not an operator of the search",
                expected="joined by '+': " + ", ".join(OPERATORS),
            )

    def outcome(self, record: dict, where: str) -> None:
        if record["status"] not in STATUSES:
            raise self.fail(f"{where}.status", shown(record["status"]), expected=", ".join(STATUSES))
        self.number(record["score"], f"{where}.score")
        if (record["score"] is not None) != (record["status"] == "scored"):
            raise self.fail(
                f"{where}.score",
                f"{shown(record['score'])} with the status {record['status']}",
                expected="a number where scored, else null",
            )
        tasks = record["tasks"]
        if not isinstance(tasks, dict) or len(tasks) > MAX_TASKS:
            raise self.fail(f"{where}.tasks", "expected an object of task scores")
        for task, score in tasks.items():
            self.number(score, f"{where}.tasks[{json_key(task)}]")

    # --- the population and the pending batch ------------------------------------------------------

    def members(self, data: dict, generation: int) -> list[tuple[str, dict]]:
        """The population's and the pending batch's members, checked as data; (where, member) each."""
        algorithm, candidates = self.search.algorithm, data["candidates"]
        population = self.listing(data["population"], "population", algorithm.population)
        members = [
            (f"population[{i}]", self.member(m, f"population[{i}]", ("id", "genome"), candidates))
            for i, m in enumerate(population)
        ]
        pending = data["pending"]
        waiting = [key for key, record in candidates.items() if record["status"] == "pending"]
        if pending is None:
            if generation == 0:  # the initial population is saved as it is proposed
                raise self.fail("pending", "null at generation 0", expected="the initial population's batch")
            if waiting:
                raise self.fail(f"candidates[{json_key(waiting[0])}].status", "pending, and no batch is")
            return members
        if data["complete"]:
            raise self.fail("pending", "a batch is pending in a complete search", expected="null")
        size = algorithm.population if generation == 0 else algorithm.offspring
        self.listing(pending, "pending", size)
        if len(pending) != size:
            raise self.fail("pending", f"holds {len(pending)} proposals; generation {generation} proposes {size}")
        for index, item in enumerate(pending):
            where = f"pending[{index}]"
            self.member(item, where, ("id", "genome", "parents", "operator", "duplicate"), candidates)
            self.lineage(item, where, candidates)
            first = candidates[item["id"]]["generation"]
            if not isinstance(item["duplicate"], bool):
                raise self.fail(f"{where}.duplicate", shown(item["duplicate"]), expected="true or false")
            if not item["duplicate"] and first != generation:
                raise self.fail(
                    f"{where}.duplicate",
                    f"false for a candidate first proposed in generation {first}, at generation {generation}",
                )
            members.append((where, item))
        proposed = {item["id"] for item in pending}
        for key in waiting:
            if key not in proposed:
                raise self.fail(f"candidates[{json_key(key)}].status", "pending, and not in the pending batch")
        return members

    def member(self, item: Any, where: str, fields: tuple[str, ...], candidates: dict) -> dict:
        self.mapping(item, where, fields)
        if not isinstance(item["id"], str) or item["id"] not in candidates:
            raise self.fail(f"{where}.id", f"{shown(item['id'])} is not a candidate of the state")
        self.genome(item["genome"], f"{where}.genome")
        return item

    def genome(self, value: Any, where: str) -> None:
        """A genome within the space, by arithmetic on its fields: nothing of its size is built."""
        space = self.search.space
        self.mapping(value, where, ("shape", "count", "params", "unit"))
        shape = value["shape"]
        if not isinstance(shape, str) or shape not in space.shapes:
            raise self.fail(
                f"{where}.shape", f"{shown(shape)} is not a shape of the space", expected=", ".join(space.shapes)
            )
        count = self.integer(value["count"], f"{where}.count", 1, space.max_blocks)
        unit = self.listing(value["unit"], f"{where}.unit", space.max_blocks)
        if not space.holds(shape, len(unit), count):
            raise self.fail(
                where,
                f"a {shape} of {len(unit)} blocks, count {count}, is not a size of the space",
                expected=f"{space.min_blocks} to {space.max_blocks} blocks",
            )
        for index, block in enumerate(unit):
            self.block(block, f"{where}.unit[{index}]")
        params, names = value["params"], {h.name: h for h in space.hyperparameters}
        if not isinstance(params, dict) or set(params) != set(names):
            raise self.fail(
                f"{where}.params",
                f"{shown(params)}",
                expected="a value of each of space.hyperparameters: " + (", ".join(names) or "none"),
            )
        for name, hyper in names.items():
            if not _allowed(hyper, params[name]):
                raise self.fail(
                    f"{where}.params[{json_key(name)}]",
                    f"{shown(params[name])} is not a value of "
                    + ("space.fill" if name == FILL else f"space.hyperparameters.{name}"),
                )

    def block(self, block: Any, where: str) -> None:
        space = self.search.space
        self.mapping(block, where, ("mixers", "channel"))
        mixers = self.listing(block["mixers"], f"{where}.mixers", 2 if space.parallel else 1)
        if (
            not mixers
            or any(not isinstance(m, str) or m not in space.sequence_mixers for m in mixers)
            or len(set(mixers)) != len(mixers)
        ):
            raise self.fail(
                f"{where}.mixers",
                shown(mixers),
                expected="different mixers of space.sequence_mixers: " + ", ".join(space.sequence_mixers),
            )
        choices = space.channel_choices(tuple(mixers))
        if not any(block["channel"] == c and type(block["channel"]) is type(c) for c in choices):
            raise self.fail(
                f"{where}.channel",
                shown(block["channel"]),
                expected="one of " + ", ".join("null" if c is None else c for c in choices),
            )

    # --- identities ----------------------------------------------------------------------------------

    def identity(self, key: str, record: dict) -> None:
        """The candidate's spec loaded again: its hash, topology, size and totals those it claims,
        within the budget."""
        where = f"candidates[{json_key(key)}]"
        self.spec_fields(record, f"{where}.spec")
        try:
            spec = spec_from_data(record["spec"])
            totals = dict(account(spec, seq_len=spec.budget_seq_len).totals)
        except MadslError as err:
            raise self.fail(f"{where}.spec", f"does not build: {err.message}") from None
        if spec.hash != key:
            raise self.fail(
                f"{where}.spec", "builds another model than the one it is filed under (its spec hash is not its key)"
            )
        if spec.canonical() != record["topology"]:
            raise self.fail(
                f"{where}.topology",
                f"{shown(record['topology'])} is not its spec's topology",
                expected=spec.canonical(),
            )
        space = self.search.space
        used = set(spec.symbols_used()) - set(space.sequence_mixers) - set(space.channel_mixers)
        blocks = sum(1 for _ in topo.blocks(spec.topology))
        if used or not space.min_blocks <= blocks <= space.max_blocks:
            raise self.fail(
                f"{where}.spec",
                f"is not a candidate of the space ({blocks} blocks"
                + (f"; {', '.join(sorted(used))} not in it)" if used else ")"),
            )
        if totals != record["totals"]:
            raise self.fail(f"{where}.totals", "are not its spec's accounting", expected=json.dumps(totals))
        violations = check(totals, spec.budget)
        if violations:
            raise self.fail(f"{where}.spec", f"is over the search's budget: {violations[0].message()}")
        self.specs[key] = spec

    def spec_fields(self, record: dict, where: str) -> None:
        """The spec is the search's shared fields, its name and topology, values of the space's
        hyperparameters and the free parameters it solved: checked before it is built."""
        spec, base = record["spec"], self.base
        if set(spec) - {"layers"} != set(base) - {"layers"}:
            raise self.fail(
                where,
                f"its fields {sorted(spec)} are not those of the search's candidates",
                expected=", ".join(sorted(set(base) | {"layers"})),
            )
        for field in set(base) - {"layers", "name", "topology"}:
            if spec[field] != base[field]:
                raise self.fail(f"{where}.{field}", f"{shown(spec[field])} is not the search file's")
        if spec["name"] != record["name"] or spec["topology"] != record["topology"]:
            raise self.fail(where, "its name and topology are not the candidate's")
        layers, shared = spec.get("layers", {}), base.get("layers", {})
        if not isinstance(layers, dict) or not all(isinstance(v, dict) for v in layers.values()):
            raise self.fail(f"{where}.layers", "expected an object of symbols' settings")
        searched = {h.name: h for h in self.search.space.layer_hyperparameters}
        varied = set(searched) | set(self.search.free)
        for symbol in set(layers) | set(shared):
            mine = {k: v for k, v in layers.get(symbol, {}).items() if f"{symbol}.{k}" not in varied}
            if mine != {k: v for k, v in shared.get(symbol, {}).items() if f"{symbol}.{k}" not in varied}:
                raise self.fail(f"{where}.layers.{symbol}", "is not the search file's")
        for name, hyper in searched.items():
            value = layers.get(hyper.symbol, {}).get(hyper.param, None)
            if not _allowed(hyper, value):
                raise self.fail(f"{where}.layers.{name}", f"{shown(value)} is not a value of space.hyperparameters")
        for name in self.search.free:
            symbol, _, param = name.partition(".")
            value, written = layers.get(symbol, {}).get(param), shared.get(symbol, {}).get(param)
            if value != record["solved"].get(name, written):
                raise self.fail(f"{where}.layers.{name}", f"{shown(value)} is neither solved nor the search file's")

    def genome_builds(self, where: str, member: dict, record: dict) -> None:
        """A member's genome builds its candidate: the same topology and hyperparameter values."""
        genome = from_data(member["genome"])
        spec = self.specs[member["id"]]
        if replace(spec, topology=genome.topology()).canonical() != record["topology"]:
            raise self.fail(
                f"{where}.genome", f"builds {genome.text()}, and its candidate is {shown(record['topology'])}"
            )
        layers = record["spec"].get("layers", {})
        for name, value in genome.params:
            if (
                name == FILL
            ):  # the fraction its state was solved toward: no layer's (its value is checked with the genome's)
                continue
            symbol, _, param = name.partition(".")
            if layers.get(symbol, {}).get(param) != value:
                raise self.fail(f"{where}.genome.params[{json_key(name)}]", f"{shown(value)} is not its candidate's")
