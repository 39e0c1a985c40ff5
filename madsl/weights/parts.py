"""What a family's name map says (its module, e.g. lfm2.py, builds it; mapping.py checks it): each
model tensor -> the checkpoint tensors it is made of, each with the shape it must have: one as it
stands, several concatenated along the first axis (a fused q/k/v), or one per expert, each
transposed and stacked along a new first axis (`stacked`: madsl's (experts, in, out) expert
weights from per-expert nn.Linear weights (out, in))."""

from __future__ import annotations

import re
from typing import Any, NamedTuple


class Part(NamedTuple):
    """A checkpoint tensor and the shape it must have; `stacked`: one expert's matrix, transposed
    into its slot of the model's stacked tensor; `take`: only the rows [start, stop) of its matrix
    (or matrices: the second-to-last axis; a fused gate-and-up projection's half); `transposed`:
    its last two axes swapped (after `take`); `offset`: added to every element in float32 (a norm
    whose checkpoint stores w where the layer computes x * (1 + w), as Gemma's and Qwen3-Next's do:
    madsl's norm holds 1 + w, rounded as transformers rounds it, and export subtracts it again);
    `reshaped`: the model's shape of the same numbers in the same order (Kimi Linear's A_log, which
    its checkpoints hold as (1, 1, heads, 1), madsl as (heads,); export reshapes it back);
    `row_scale`: runs (rows, factor) along the checkpoint tensor's first axis, covering it, each row
    multiplied by its factor in float32 before anything else (a multiplier the family applies right
    before or after a linear map, folded into its weight and bias: Falcon-H1's µP multipliers);
    export divides it out again last; not with `take` or `stacked`."""

    name: str
    shape: tuple[int, ...]
    stacked: bool = False
    take: tuple[int, int] | None = None
    transposed: bool = False
    offset: float = 0.0
    reshaped: tuple[int, ...] | None = None
    row_scale: tuple[tuple[int, float], ...] = ()

    def placed_shape(self) -> tuple[int, ...]:
        """The shape of what this part puts into the model tensor."""
        shape = list(self.shape)
        if self.take is not None:
            shape[-2] = self.take[1] - self.take[0]
        if self.transposed:
            shape[-2], shape[-1] = shape[-1], shape[-2]
        return tuple(shape) if self.reshaped is None else self.reshaped

    def placed(self, tensor: Any) -> Any:
        """The checkpoint tensor as this part puts it into the model tensor."""
        if self.row_scale:
            tensor = tensor.float() * self.row_factors(tensor)
        if self.take is not None:
            tensor = tensor[..., self.take[0] : self.take[1], :]
        if self.offset:
            tensor = tensor.float() + self.offset
        tensor = tensor.transpose(-1, -2) if self.transposed else tensor
        return tensor if self.reshaped is None else tensor.reshape(self.reshaped)

    def row_factors(self, tensor: Any) -> Any:
        """`row_scale` as one float32 factor per row of `tensor` (the checkpoint tensor), shaped to
        broadcast over its other axes."""
        import torch

        if self.take is not None or self.stacked or sum(rows for rows, _ in self.row_scale) != tensor.shape[0]:
            raise ValueError(f"{self.name}: row_scale {self.row_scale} does not cover its {tensor.shape[0]} rows alone")
        rows = torch.tensor([rows for rows, _ in self.row_scale])
        factors = torch.tensor([factor for _, factor in self.row_scale], dtype=torch.float32)
        return factors.repeat_interleave(rows).reshape(-1, *[1] * (tensor.dim() - 1))


def model_shape(parts: tuple[Part, ...]) -> tuple[int, ...]:
    """The shape of the model tensor `parts` make."""
    if parts[0].stacked:
        return (len(parts), *reversed(parts[0].shape))
    shapes = [part.placed_shape() for part in parts]
    return shapes[0] if len(shapes) == 1 else (sum(shape[0] for shape in shapes), *shapes[0][1:])


def expert_matrices(model: Any, names: dict[str, str], checkpoint_name: str) -> Sources:
    """Each stacked expert tensor of the model's mixtures of experts (`body.i.channel.layer.X` for X
    in `names`) -> one checkpoint matrix per expert, named `checkpoint_name.format(block=i,
    expert=e, matrix=names[X])`."""
    out: Sources = {}
    for name, tensor in model.state_dict().items():
        block, _, rest = name.removeprefix("body.").partition(".channel.layer.")
        if rest in names:
            found = [checkpoint_name.format(block=block, expert=e, matrix=names[rest]) for e in range(tensor.shape[0])]
            out[name] = experts(found, tuple(tensor.shape))
    return out


def experts(names: list[str], shape: tuple[int, ...]) -> tuple[Part, ...]:
    """A stacked expert tensor of `shape` (experts, in, out) from one (out, in) matrix per expert."""
    return tuple(Part(name, (shape[2], shape[1]), stacked=True) for name in names)


# a model tensor -> its parts (several: concatenated along the first axis, in order)
Sources = dict[str, tuple[Part, ...]]


def one(name: str, shape: tuple[int, ...]) -> tuple[Part, ...]:
    """A model tensor that is one checkpoint tensor as it stands."""
    return (Part(name, tuple(shape)),)


def qkv(attention: Any, q: str, k: str, v: str, shape: tuple[int, ...]) -> tuple[Part, ...]:
    """madsl's fused attention projection (weight or bias of `shape`) from a checkpoint's separate
    q, k and v tensors, in that order: the query heads' rows, then the key-value heads'."""
    rows = (attention.heads * attention.head_dim, attention.kv_heads * attention.head_dim)
    rest = tuple(shape[1:])
    return (Part(q, (rows[0], *rest)), Part(k, (rows[1], *rest)), Part(v, (rows[1], *rest)))


def layered(
    model: Any,
    top: dict[str, str],
    rules: tuple[tuple[str, str], ...],
    attention: str = "self_attn",
    layers: str = "model.layers",
) -> Sources:
    """The name map of a family whose checkpoint has one entry per madsl block (`model.layers.i`):
    `top` maps the model's tensors outside the blocks (embedding, final norm, head) to checkpoint
    names (a tensor the model lacks, e.g. a tied head, is skipped); inside block i, a fused
    q/k/v projection comes from `{attention}.{q,k,v}_proj`, every other tensor from the first rule
    (madsl pattern after `body.i.`, checkpoint replacement after `model.layers.i.`) it matches."""
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    out: Sources = {name: one(source, state[name]) for name, source in top.items() if name in state}
    for name, shape in state.items():
        match = re.fullmatch(r"body\.(\d+)\.(.+)", name)
        if match is None:
            continue
        layer, rest = match.groups()
        prefix = f"{layers}.{layer}."
        fused = re.fullmatch(r"mixer\.layer\.qkv\.(weight|bias)", rest)
        if fused is not None:
            q, k, v = (f"{prefix}{attention}.{x}_proj.{fused.group(1)}" for x in "qkv")
            out[name] = qkv(model.get_submodule(f"body.{layer}.mixer.layer"), q, k, v, shape)
            continue
        for pattern, target in rules:
            if re.fullmatch(pattern, rest):
                out[name] = one(prefix + re.sub(pattern, target, rest), shape)
                break
    return out
