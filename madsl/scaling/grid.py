"""The runs of a study: each architecture at each size of each IsoFLOP group, sized, accounted
and given the steps its budget buys.

A size's model is the architecture's spec at that width (`dim`) with its topology repeated
`repeat` times, the data's vocabulary and the study's sequence length (its MAD budget dropped:
a scaled model is not held to the small model's state budget). A parameter target is met by the
width, in steps of `dim_step`, whose accounted parameters are closest to it (widths a layer
cannot take, e.g. heads that do not divide it, are passed over). Parameters N are the
accounting's total (embeddings included, tied once, as the paper's Table C.2 counts them);
total state is the fixed state plus the KV cache at the training length (the paper's Fig. 4.3).
Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from madsl.errors import MadslError
from madsl.runner.pretrain.recipe import PretrainSettings, paper_learning_rate, steps_for_budget, train_flops_per_token
from madsl.scaling.study import BudgetGroup, Size, Study, group_lrs, group_seeds, study_location

MAX_DIM = 16384  # widths searched for a parameter target


@dataclass(frozen=True)
class ScaleRun:
    """One run of a study, planned: what it trains, how long, at what cost."""

    arch: str
    budget: float
    size: str  # the size as the study writes it (`d64x2`, `p2e+05x2`)
    spec: Any  # the sized Spec
    params: int
    state: int  # fixed state + KV cache at the training length
    flops_per_token: float  # training FLOPs (forward + backward) per token
    settings: PretrainSettings
    active_params: int = 0  # the parameters one token reads (a routed layer's chosen experts only)
    embedding_params: int = 0  # of `params`, the embedding, positions and head (tied: once)

    def label(self, ladder: bool = False, replicates: bool = False) -> str:
        """`arch size @ budget`, with the learning rate and seed where the study has several."""
        more = (f" lr {self.settings.lr:.3g}" if ladder else "") + (f" seed {self.settings.seed}" if replicates else "")
        return f"{self.arch} {self.size} @ {self.budget:.2g}{more}"

    @property
    def tokens(self) -> int:
        return self.settings.tokens

    @property
    def flops(self) -> float:
        """What the run spends: within one step of its budget, never over it."""
        return self.tokens * self.flops_per_token


def sized_spec(spec: Any, dim: int, repeat: int, vocab: int, seq_len: int, name: str) -> Any:
    """The spec at width `dim`, its topology repeated `repeat` times, for this vocabulary and length.
    A spec that asks for a fit (`budget.fit`, e.g. a search's front) keeps its budget and has its
    free parameters solved into it at this width, as `madsl eval` solves them (madsl.fit.fitted):
    what a width trains meets the budget, not the values solved at another width."""
    from madsl.lang.spec import spec_from_data

    dropped = ("extends", "eval") if spec.fit else ("budget", "extends", "eval")
    data = {k: v for k, v in spec.data.items() if k not in dropped}
    topology = spec.topology_text.strip()
    data.update(
        name=name, dim=dim, vocab=vocab, seq_len=seq_len, topology=topology if repeat == 1 else f"({topology})x{repeat}"
    )
    sized = spec_from_data(data)
    return _fitted_at_width(sized) if sized.fit else sized


def _fitted_at_width(spec: Any) -> Any:
    """`spec` with its free parameters solved into its budget (an error where no values meet it)."""
    from madsl.fit import fitted
    from madsl.graph import account
    from madsl.lang.budget import check

    solved, _ = fitted(spec)
    broken = check(account(solved, seq_len=solved.budget_seq_len).totals, solved.budget)
    if broken:
        raise MadslError(
            f"no values of {', '.join(spec.fit)} meet the budget at width {spec.dim}: "
            + "; ".join(v.message() for v in broken),
            hint="leave this width out, or widen the spec's budget",
        )
    return solved


def fitted_values(spec: Any) -> dict[str, Any]:
    """The values of the spec's free parameters (`budget.fit`) as it trains: `SYMBOL.param` -> value."""
    values = {}
    for item in spec.fit:
        symbol, param = spec.free_parameter(item)
        values[item] = spec.symbols[symbol].params.get(param)
    return values


# the model-level parts that map tokens to and from vectors (madsl.graph.PartRow names)
EMBEDDING_PARTS = ("embedding", "positions", "head")


def _accounted(spec: Any, seq_len: int) -> dict[str, int]:
    """The accounting's totals, and the parameters of the embedding parts (N's two conventions:
    with them, as the paper's Table C.2 counts, and without, as Kaplan et al. count)."""
    from madsl.graph import account

    accounted = account(spec, seq_len=seq_len)
    embedding = sum(p.params for p in accounted.parts if p.name in EMBEDDING_PARTS)
    return {**accounted.totals, "embedding_params": embedding}


def _width_for(spec: Any, size: Size, vocab: int, seq_len: int, name: str) -> tuple[Any, dict[str, int]]:
    """The sized spec whose parameters are closest to the size's target."""
    best: tuple[float, Any, dict] | None = None
    dim = size.dim_step
    while dim <= MAX_DIM:
        try:
            candidate = sized_spec(spec, dim, size.repeat, vocab, seq_len, name)
            totals = _accounted(candidate, seq_len)
        except MadslError:  # a width this architecture cannot take (heads, groups): the next one
            dim += size.dim_step
            continue
        distance = abs(math.log(totals["params"] / size.params))
        if best is None or distance < best[0]:
            best = (distance, candidate, totals)
        if totals["params"] > size.params:  # parameters grow with the width: past the target, done
            break
        dim += size.dim_step
    if best is None:
        raise MadslError(f"{name}: no width up to {MAX_DIM} in steps of {size.dim_step} builds this architecture")
    return best[1], best[2]


def _settings(
    study: Study, group: BudgetGroup, params: int, flops_per_token: float, where: str
) -> list[PretrainSettings]:
    """The settings of a sized model's runs in a group: one per learning rate of the recipe's
    ladder and seed replicate (ladder outer, seeds inner)."""
    recipe = dict(study.recipe)
    recipe.pop("lr", None)
    first_seed = recipe.pop("seed", 0)
    tokens_per_step = group.batch_size * study.seq_len
    steps = steps_for_budget(group.flops, flops_per_token, tokens_per_step, where)
    return [
        PretrainSettings(
            seq_len=study.seq_len,
            batch_size=group.batch_size,
            steps=steps,
            lr=paper_learning_rate(params) if lr == "paper" else float(lr),
            seed=first_seed + replicate,
            **recipe,
        )
        for lr in group_lrs(study, group)
        for replicate in range(group_seeds(study, group))
    ]


def _sized(study: Study, arch: str, size: Size, vocab: int) -> tuple[Any, dict[str, int]]:
    """The architecture at a size, and its accounting; an error located at the size's entry."""
    name = f"{arch}-{size.label()}"
    try:
        if size.dim is not None:
            sized = sized_spec(study.architectures[arch], size.dim, size.repeat, vocab, study.seq_len, name)
            return sized, _accounted(sized, study.seq_len)
        return _width_for(study.architectures[arch], size, vocab, study.seq_len, name)
    except MadslError as err:
        if err.location.file is None:
            err.message = f"architecture {arch} at size {size.label()}: {err.message}"
            err.location = study_location(study, *(size.where or ("sizes",)))
        raise


def plan_study(study: Study, vocab: int) -> list[ScaleRun]:
    """Every run of the study (architecture x budget x size x learning rate x seed replicate), sized
    and accounted; a size an
    architecture cannot take is an error located at the size, a budget smaller than one step of
    a model one located at the budget."""
    runs = []
    models: dict[tuple[str, Size], tuple[Any, dict[str, int]]] = {}  # a size shared by budgets is sized once
    for group in study.budgets:
        for size in group.sizes:
            for arch in study.architectures:
                if (arch, size) not in models:
                    models[(arch, size)] = _sized(study, arch, size, vocab)
                sized, totals = models[(arch, size)]
                name = f"{arch}-{size.label()}"
                flops_per_token = train_flops_per_token(totals["flops"], study.seq_len)
                try:
                    every = _settings(
                        study, group, totals["params"], flops_per_token, f"{name} at budget {group.flops:.3g}: "
                    )
                except MadslError as err:
                    if err.location.file is None:
                        err.location = study_location(study, *(group.where or ("budgets",)))
                    raise
                runs += [
                    ScaleRun(
                        arch,
                        group.flops,
                        size.label(),
                        sized,
                        totals["params"],
                        totals["fixed_state"] + totals["kv_cache"],
                        flops_per_token,
                        settings,
                        totals["active_params"],
                        totals["embedding_params"],
                    )
                    for settings in every
                ]
    return runs
