"""The units a `Model` (madsl/model.py) is wired of, and the state they walk.

Wired as its plan says (madsl/compiler.py reads it): a `Block` joins its parts to the stream by the
plan's residual adds (`x + mixer(norm(x))`, then `x + channel(norm(x))`), a layer and its pre-norm
one `PreNorm` unit (so a tag, `H#a`, shares both); parallel mixers share one norm owned by their
block and are summed; an injector (`Zs#a>M2`) adds its output to its part's norm input (`Inject`);
a group's connection is a `GroupConnection`, a group of branches, `(X | Y)`,
a `Fork` (a splitter feeds each branch, a sub-stack, and a combiner joins them).

Each unit also walks the recurrent-inference state (`init_state`, `step`, `prefill`: one state
dict per stateful layer use, in stack order; madsl/model.py's docstring).
"""

from __future__ import annotations

import torch
from torch import nn

State = list  # list[dict[str, torch.Tensor]]: one state dict per stateful layer use, in stack order


def _stateful(layer: nn.Module) -> bool:
    return hasattr(layer, "init_state")


def _layer_init(layer: nn.Module, batch: int, device, dtype, out: State) -> None:
    if _stateful(layer):
        out.append(layer.init_state(batch, device=device, dtype=dtype))


def _layer_step(layer: nn.Module, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
    """One token through one layer use: its step with its own state, or (a channel mixer) itself."""
    if not _stateful(layer):
        return layer(x_t[:, None])[:, 0]
    state = next(states, None)
    if state is None:
        raise ValueError("the state does not belong to this model (use model.init_state or model.prefill)")
    y_t, state = layer.step(x_t, state)
    out.append(state)
    return y_t


@torch.no_grad()
def _layer_prefill(layer: nn.Module, x: torch.Tensor, out: State) -> torch.Tensor:
    """The parallel forward of one layer use, and the state it leaves after the sequence:
    from the layer's own `prefill` where it has one, else by stepping over the sequence."""
    if not _stateful(layer):
        return layer(x)
    if hasattr(layer, "prefill"):
        y, state = layer.prefill(x)
    else:
        y = layer(x)
        state = layer.init_state(x.shape[0], device=x.device, dtype=x.dtype)
        for t in range(x.shape[1]):
            state = layer.step(x[:, t], state)[1]
    out.append(state)
    return y


def _seq_init(modules, batch: int, device, dtype, out: State) -> None:
    for module in modules:
        module.init_state(batch, device, dtype, out)


def _seq_step(modules, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
    for module in modules:
        x_t = module.step(x_t, states, out)
    return x_t


def _seq_prefill(modules, x: torch.Tensor, out: State) -> torch.Tensor:
    for module in modules:
        x = module.prefill(x, out)
    return x


DEFAULT_NORM_EPS = 1e-5


def make_norm(kind: str, dim: int, eps: float = DEFAULT_NORM_EPS) -> nn.Module:
    # RMSNorm with a weight only (Transformer++), or LayerNorm with weight and bias
    return nn.RMSNorm(dim, eps=eps) if kind == "rms" else nn.LayerNorm(dim, eps=eps)


class PreNorm(nn.Module):
    """A layer with the norm in front of it."""

    def __init__(self, norm: nn.Module, layer: nn.Module):
        super().__init__()
        self.norm, self.layer = norm, layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(x))

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _layer_init(self.layer, batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        return _layer_step(self.layer, self.norm(x_t), states, out)

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        return _layer_prefill(self.layer, self.norm(x), out)


class Parallel(nn.Module):
    """Sequence mixers reading one normed input; their outputs are summed."""

    def __init__(self, norm: nn.Module, branches: list[nn.Module]):
        super().__init__()
        self.norm, self.branches = norm, nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return sum(branch(h) for branch in self.branches)

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        for branch in self.branches:
            _layer_init(branch, batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        h = self.norm(x_t)
        return sum(_layer_step(branch, h, states, out) for branch in self.branches)

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        h = self.norm(x)
        return sum(_layer_prefill(branch, h, out) for branch in self.branches)


class Inject(nn.Module):
    """A block's mixer part with an injector (`Zs#a>M2`): the injector reads the part's input x, and its
    output is added to the input of the part's pre-norm, not to the stream: unit(x + injector(x)) (Zamba2's
    hybrid layer, h + M2(norm(h + z)), with the block's residual add around it). The injector's state
    comes before the part's."""

    def __init__(self, injector: nn.Module, unit: nn.Module):
        super().__init__()
        self.injector, self.unit = injector, unit

    @property
    def norm(self) -> nn.Module:  # the part's pre-norm (a postnorm block's residual reads it)
        return self.unit.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unit(x + self.injector(x))

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _layer_init(self.injector, batch, device, dtype, out)
        self.unit.init_state(batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        return self.unit.step(x_t + _layer_step(self.injector, x_t, states, out), states, out)

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        return self.unit.prefill(x + _layer_prefill(self.injector, x, out), out)


def connect(kind: str, x: torch.Tensor, out: torch.Tensor, gate: nn.Module | None = None) -> torch.Tensor:
    """How the output `out` of a block's part or of a group's sub-stack joins the stream `x` it
    read: `add` x + out, `gated` (1 - g) * x + g * out with g = sigmoid(gate(x))."""
    if kind == "gated":
        g = torch.sigmoid(gate(x))
        return (1 - g) * x + g * out
    return x + out


class Block(nn.Module):
    """A block as its plan wires it: its parts (`mixer`, `channel`) in order, each joined to the stream by its kind.

    Each part's output is multiplied by `residual_scale` (Granite's) and by its own beta of `factors`
    ((alpha, beta) per part), its residual by its alpha; the residual is the part's input, or with
    `postnorm` its normed input (MiniMax's layers: `alpha * norm(x) + beta * layer(norm(x))`)."""

    def __init__(
        self,
        parts: list[tuple[str, nn.Module, str]],
        residual_scale: float = 1.0,
        factors: list[tuple[float, float]] | None = None,
        postnorm: bool = False,
    ):
        super().__init__()
        for name, module, _ in parts:
            self.add_module(name, module)
        self.wiring = tuple((name, join) for name, _, join in parts)  # (part, its join kind), in order
        self.residual_scale = residual_scale  # each part's output times this before it joins (Granite's)
        self.factors = tuple(factors or [(1.0, 1.0)] * len(parts))
        self.postnorm = postnorm

    def _join(self, index: int, join: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Part `index`'s output `out` joined to the stream `x` it read."""
        alpha, beta = self.factors[index]
        residual = getattr(self, self.wiring[index][0]).norm(x) if self.postnorm else x
        if alpha != 1.0:
            residual = residual * alpha
        out = out if self.residual_scale == 1.0 else out * self.residual_scale
        return connect(join, residual, out if beta == 1.0 else out * beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, (name, join) in enumerate(self.wiring):
            x = self._join(index, join, x, getattr(self, name)(x))
        return x

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _seq_init([getattr(self, name) for name, _ in self.wiring], batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        for index, (name, join) in enumerate(self.wiring):
            x_t = self._join(index, join, x_t, getattr(self, name).step(x_t, states, out))
        return x_t

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        for index, (name, join) in enumerate(self.wiring):
            x = self._join(index, join, x, getattr(self, name).prefill(x, out))
        return x


class GroupConnection(nn.Module):
    """A group's sub-stack joined to its input by `connect` (`gated`: seed 004's "Gated-res", its gate W x + b)."""

    def __init__(self, body: list[nn.Module], residual: str, dim: int):
        super().__init__()
        self.body, self.residual = Stack(*body), residual
        self.gate = nn.Linear(dim, dim) if residual == "gated" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return connect(self.residual, x, self.body(x), self.gate)

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _seq_init(self.body, batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        return connect(self.residual, x_t, _seq_step(self.body, x_t, states, out), self.gate)

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        return connect(self.residual, x, _seq_prefill(self.body, x, out), self.gate)


class Projector(nn.Module):
    """One side of a group of branches, per branch i (seed 004's HybridModel projectors,
    hybrid/projector.py): `res` x_i + P_i(x_i); `gated` (1 - g_i) * P_i(x_i) + g_i * x_i with
    a learned scalar g_i = a_i (init 1); `gated_soft` the same with (g_1, g_2) = softmax(a, 1 - a)
    of one learned scalar a (init N(0, 1)); `copy` and `mean` pass x_i through. P_i is a
    Linear(dim, dim) with bias, initialised as torch's default."""

    def __init__(self, kind: str, branches: int, dim: int):
        super().__init__()
        self.kind = kind
        projected = kind in ("res", "gated", "gated_soft")
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(branches)) if projected else None
        self.alpha = None  # the learned gates: one per branch from 1 (gated), one from N(0, 1) (gated_soft)
        if kind == "gated":
            self.alpha = nn.Parameter(torch.ones(branches))
        elif kind == "gated_soft":
            self.alpha = nn.Parameter(torch.randn(1))

    def gates(self) -> torch.Tensor:
        """g_i: the weight of each branch's input against its projection."""
        if self.kind == "gated_soft":
            return torch.softmax(torch.cat([self.alpha, 1 - self.alpha]), dim=0)
        return self.alpha

    def join_weights(self) -> torch.Tensor | None:
        """A combiner's weight of each branch in the join: softmax(a) (`gated`), g_i (`gated_soft`);
        None: the mean."""
        if self.alpha is None:
            return None
        return self.gates() if self.kind == "gated_soft" else torch.softmax(self.alpha, dim=0)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.proj is None:
            return xs
        if self.alpha is None:
            return [x + proj(x) for x, proj in zip(xs, self.proj)]
        return [(1 - g) * proj(x) + g * x for x, proj, g in zip(xs, self.proj, self.gates())]


class Fork(nn.Module):
    """A group of branches: every branch (a sub-stack) reads the splitter's projection of the
    input, and the combiner joins the branches' projected outputs: their mean (`mean`, `res`),
    or their sum weighted by softmax(a) of the combiner's gates (`gated`) or by its g_i (`gated_soft`)."""

    def __init__(self, branches: list[nn.Module], split: str, combine: str, dim: int):
        super().__init__()
        self.branches = nn.ModuleList(branches)
        self.split = Projector(split, len(branches), dim)
        self.combine = Projector(combine, len(branches), dim)

    def _join(self, ys: list[torch.Tensor]) -> torch.Tensor:
        ys = self.combine(ys)
        weights = self.combine.join_weights()
        if weights is None:
            return sum(ys) / len(ys)
        return sum(w * y for w, y in zip(weights, ys))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = self.split([x] * len(self.branches))
        return self._join([branch(x_i) for branch, x_i in zip(self.branches, xs)])

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _seq_init(self.branches, batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        xs = self.split([x_t] * len(self.branches))
        return self._join([branch.step(x_i, states, out) for branch, x_i in zip(self.branches, xs)])

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        xs = self.split([x] * len(self.branches))
        return self._join([branch.prefill(x_i, out) for branch, x_i in zip(self.branches, xs)])


def reinit_linears(module: nn.Module, std: float) -> None:
    """GPT-2 / GPT-Neo's init: every Linear weight N(0, std), biases zero (Mamba's dt_proj,
    whose bias is marked `_no_reinit`, keeps its own, as Hugging Face's Mamba does)."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear) and not getattr(sub.bias, "_no_reinit", False):
            nn.init.normal_(sub.weight, std=std)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)


class Stack(nn.Sequential):
    """Blocks in order (a group without a connection)."""

    def init_state(self, batch: int, device, dtype, out: State) -> None:
        _seq_init(self, batch, device, dtype, out)

    def step(self, x_t: torch.Tensor, states, out: State) -> torch.Tensor:
        return _seq_step(self, x_t, states, out)

    def prefill(self, x: torch.Tensor, out: State) -> torch.Tensor:
        return _seq_prefill(self, x, out)
