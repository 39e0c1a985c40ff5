"""What a pretraining run trains by: its settings (`PretrainSettings`), the paper's recipe as
their defaults, and the arithmetic that turns a FLOP budget into steps.

MAD paper App. C: AdamW with betas (0.9, 0.95), weight decay 0.1, no dropout, a cosine schedule
with a linear warmup over 1 % of the steps, decaying to 10 % of the peak learning rate; the
learning rate interpolated linearly in model size between the settings of Table C.2 (inversely
related to size); the batch size fixed within an IsoFLOP group (Table C.1). The training cost of a
token is three forward passes' worth (forward + backward) of the accounting's forward FLOPs
(App. C.4), so a budget C buys `C / (3 · forward FLOPs per token)` tokens.

Torch-free: the plan (`madsl scale --dry-run`) uses it without building a model.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, overload

from madsl.errors import MadslError
from madsl.lang.declare import Choice, Custom, Either, Flag, Key, Kind, Number, Section, Where
from madsl.runner.common.choices import MAX_SEED, TRAIN_FORWARDS, TRAIN_PRECISIONS

# MAD paper Table C.2: (parameters, learning rate) of its common settings, smallest first
PAPER_LEARNING_RATES: tuple[tuple[float, float], ...] = (
    (8e6, 9.77e-4),
    (22e6, 9.57e-4),
    (38e6, 9.36e-4),
    (54e6, 9.15e-4),
    (70e6, 8.95e-4),
    (102e6, 8.56e-4),
    (118e6, 8.37e-4),
    (134e6, 8.18e-4),
    (150e6, 8.00e-4),
    (163e6, 7.75e-4),
    (175e6, 7.50e-4),
    (196e6, 7.25e-4),
    (217e6, 7.00e-4),
    (251e6, 6.75e-4),
    (278e6, 6.50e-4),
    (306e6, 6.25e-4),
    (350e6, 6.00e-4),
    (440e6, 5.66e-4),
    (536e6, 5.33e-4),
    (641e6, 5.00e-4),
    (756e6, 4.75e-4),
    (881e6, 4.55e-4),
    (1010e6, 4.33e-4),
    (1160e6, 4.15e-4),
    (1200e6, 4.11e-4),
    (1300e6, 4.00e-4),
    (1600e6, 3.84e-4),
    (1900e6, 3.67e-4),
    (2250e6, 3.47e-4),
    (2400e6, 3.39e-4),
    (2640e6, 3.25e-4),
    (3100e6, 3.00e-4),
    (4200e6, 2.72e-4),
    (5200e6, 2.46e-4),
    (7000e6, 2.00e-4),
)


def paper_learning_rate(params: float) -> float:
    """Table C.2's learning rate for a model of `params` parameters: linear interpolation between
    its sizes, its smallest (largest) size's rate below (above) its range."""
    sizes = [size for size, _ in PAPER_LEARNING_RATES]
    if params <= sizes[0]:
        return PAPER_LEARNING_RATES[0][1]
    if params >= sizes[-1]:
        return PAPER_LEARNING_RATES[-1][1]
    right = bisect.bisect_left(sizes, params)
    (n0, lr0), (n1, lr1) = PAPER_LEARNING_RATES[right - 1], PAPER_LEARNING_RATES[right]
    return lr0 + (lr1 - lr0) * (params - n0) / (n1 - n0)


_FRACTION = Number(minimum=0, maximum=1, below=True)  # 0 <= x < 1
_ONE_LR = Either(
    (Choice(("paper",), "lr"), Number(minimum=0, inclusive=False)),
    "expected a number above 0 or `paper`",
    "paper: Table C.2's learning rate for the model's size",
)


def _learning_rates(value: Any, where: Where, source: str) -> Any:
    """A learning rate (a number or `paper`), or a list of them: a ladder, each value once."""
    if not isinstance(value, list):
        return _ONE_LR.check(value, where, source)
    if not value:
        raise MadslError(f"{source}: the list is empty", where.value(), expected="learning rates, or paper")
    out: list = []
    for i, item in enumerate(value):
        rate = _ONE_LR.check(item, where.below(i), source)
        if rate in out:
            raise MadslError(f"{source}: {rate!r} is given twice", where.value(i), hint="list each value once")
        out.append(rate)
    return out


def _recipe(kind: Kind, help: str, default: Any, required: bool = False) -> Any:
    """A field a study's `recipe:` may set: its declaration there, and the study's default for it
    (`required`: the field itself has none, a run is always given one)."""
    return field(default=MISSING if required else default, metadata={"recipe": (kind, help, default)})


@dataclass(frozen=True)
class PretrainSettings:
    """Everything about how one pretraining run trains (model and data aside). Its fields, with
    the data's content hash, are the run's identity. A field a study's `recipe:` may set declares
    its key there (`_recipe`): what its value may be, what it means, the study's default."""

    seq_len: int
    batch_size: int = _recipe(
        Number(integer=True, minimum=1), "sequences per step (tokens per step: batch_size x seq_len)", 16, required=True
    )
    steps: int  # optimizer steps: the FLOP budget's (`steps_for_budget`)
    lr: float = _recipe(
        Custom(
            _learning_rates, {"anyOf": [_ONE_LR.schema(), {"type": "array", "items": _ONE_LR.schema(), "minItems": 1}]}
        ),
        "the peak learning rate, or paper: Table C.2's for the model's size; a list is a ladder (a run each)",
        "paper",
        required=True,
    )
    seed: int = _recipe(Number(integer=True, minimum=0, maximum=MAX_SEED), "the seed of init and data order", 0)
    wd: float = _recipe(Number(minimum=0), "AdamW's weight decay", 0.1)
    decay_hyena: bool = _recipe(
        Flag(), "weight decay on the Hyena layers' parameters too (the paper's App. C: none; `wd` elsewhere)", False
    )
    beta1: float = _recipe(_FRACTION, "AdamW's beta1", 0.9)
    beta2: float = _recipe(_FRACTION, "AdamW's beta2", 0.95)
    warmup: float = _recipe(_FRACTION, "the linear warmup, a fraction of the steps", 0.01)
    min_lr_ratio: float = _recipe(_FRACTION, "the cosine decays to lr x this", 0.1)
    grad_clip: float = _recipe(Number(minimum=0), "the gradient's global norm is clipped to this (0: no clipping)", 1.0)
    eval_every: int = _recipe(
        Number(integer=True, minimum=0), "steps between validation evaluations (0: about 10 along the run)", 0
    )
    eval_tokens: int = _recipe(Number(integer=True, minimum=1), "validation tokens scored at each evaluation", 65536)
    precision: str = _recipe(
        Choice(TRAIN_PRECISIONS, "precision", "bf16 trains in bfloat16 autocast with float32 master weights"),
        "fp32, or bf16: bfloat16 autocast with float32 master weights",
        "fp32",
    )

    def identity(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.warmup * self.steps)) if self.warmup > 0 else 0

    def evaluation_steps(self) -> "EvaluationSchedule":
        """The steps after which the validation split is scored: every `eval_every`, and the last
        (a schedule computed, never listed: `eval_every: 1` over 10^12 steps costs nothing)."""
        return EvaluationSchedule(self.eval_every or max(1, math.ceil(self.steps / 10)), self.steps)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based): linear warmup, then cosine to min_lr_ratio."""
        warmup = self.warmup_steps
        if step < warmup:
            return self.lr * (step + 1) / warmup
        span = max(1, self.steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# a study's `recipe:` (madsl.scaling.study): the fields above that declare a key there
RECIPE = Section(
    "the recipe",
    tuple(Key(f.name, *f.metadata["recipe"]) for f in fields(PretrainSettings) if "recipe" in f.metadata),
    description="how every run of the study trains (MAD paper App. C)",
)


@dataclass(frozen=True)
class EvaluationSchedule(Sequence[int]):
    """Every `every`-th step below `steps`, then `steps`: a sequence whose length, membership
    and items are arithmetic (a run's identity counts its evaluations; the loop asks about each step)."""

    every: int
    steps: int

    def __post_init__(self) -> None:
        if self.every < 1 or self.steps < 1:
            raise ValueError(f"an evaluation schedule needs every >= 1 and steps >= 1, got {self.every}, {self.steps}")

    @property
    def _before_last(self) -> range:
        return range(self.every, self.steps, self.every)

    def __len__(self) -> int:
        return len(self._before_last) + 1

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("evaluation index out of range")
        return self.steps if index == count - 1 else self._before_last[index]

    def __contains__(self, step: object) -> bool:
        return step == self.steps or step in self._before_last

    def __iter__(self) -> Iterator[int]:
        yield from self._before_last
        yield self.steps

    def next_after(self, step: int) -> int | None:
        """The first evaluation after `step` (None: none is left)."""
        if step >= self.steps:
            return None
        following = (max(step, 0) // self.every + 1) * self.every
        return following if following < self.steps else self.steps


def train_flops_per_token(forward_flops_per_sequence: int, seq_len: int) -> float:
    """Training FLOPs of one token, from the accounting's forward FLOPs of one sequence."""
    return TRAIN_FORWARDS * forward_flops_per_sequence / seq_len


def steps_for_budget(budget: float, flops_per_token: float, tokens_per_step: int, where: str = "") -> int:
    """The optimizer steps a FLOP budget buys: the most whole steps within it, so a run stops
    within one step of its budget (never past it). A budget smaller than one step is an error."""
    step_flops = flops_per_token * tokens_per_step
    steps = int(budget // step_flops)
    if steps < 1:
        raise MadslError(
            f"{where}a FLOP budget of {budget:.3g} is smaller than one training step "
            f"({step_flops:.3g} FLOPs: {tokens_per_step:,} tokens x {flops_per_token:.3g} FLOPs "
            f"per token)",
            hint="raise the budget, or take a smaller model, batch or sequence length",
        )
    return steps


def settings_from_mapping(values: Mapping[str, Any]) -> PretrainSettings:
    """PretrainSettings from a stored identity (`PretrainSettings.identity`)."""
    return PretrainSettings(**dict(values))
