"""A stack's trainable parameters as flat tensors, one set per optimizer group (`FlatParameters`): what
lets a stacked group's AdamW (`madsl.runner.batched.stacked`, `madsl.runner.pretrain.stacked`) be a
few ops per group, and its backward add into gradients that live as long as the stack, as a CUDA
graph needs (`madsl.runner.batched.replay`).

Apart from the stacks, which update these tensors, because this is their layout (where each
parameter's (members, *shape) block lies, which member each element belongs to) and the moves in
and out of it every stack makes: the members' weights and AdamW moments stacked (`stack_members`),
AdamW's update along the member axis (`adamw_update`), and each member's slice written back into
its own model and optimizer in torch's layout (`write_back`), so checkpoints are unbatched ones.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch


class FlatParameters:
    """The stacked trainable parameters of one optimizer group (of one dtype) in one flat
    tensor each for the weights, their gradients and the two Adam moments: parameter after
    parameter, each a contiguous (members, *shape) block, which every parameter is a view of.
    AdamW is then a few ops for all the group's parameters instead of a few per parameter,
    and the backward adds into one gradient tensor that lives as long as the stack (as a CUDA
    graph needs). `member_of` gives each element's member, for the per-member lr and decay."""

    def __init__(self, group: int, names: list[str], shapes: list[tuple], blocks: dict[str, list[torch.Tensor]]):
        self.group, self.names, self.shapes = group, names, shapes
        self.sizes = [math.prod(shape) for shape in shapes]
        # blocks: "param", "exp_avg", "exp_avg_sq" -> per parameter, its (members, *shape) stack
        self.param, self.exp_avg, self.exp_avg_sq = (
            torch.cat([b.reshape(-1) for b in blocks[key]]) for key in ("param", "exp_avg", "exp_avg_sq")
        )
        self.members = blocks["param"][0].shape[0]
        self._derived()

    def _derived(self) -> None:
        self.grad = torch.zeros_like(self.param)
        self.member_of = torch.cat(
            [torch.arange(self.members, device=self.param.device).repeat_interleave(size) for size in self.sizes]
        )

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's (members, *shape) view of a flat tensor."""
        blocks = flat.split([self.members * size for size in self.sizes])
        return {name: block.view(self.members, *shape) for name, shape, block in zip(self.names, self.shapes, blocks)}

    def leaves(self) -> dict[str, torch.Tensor]:
        """The parameters as leaves of autograd sharing the weights' memory, each with its
        block of the gradient tensor as .grad."""
        grads = self.views(self.grad)
        leaves = {}
        for name, view in self.views(self.param).items():
            leaves[name] = view.detach().requires_grad_()
            leaves[name].grad = grads[name]
        return leaves

    def keep(self, index: torch.Tensor) -> None:
        """Only these members' blocks."""
        for key in ("param", "exp_avg", "exp_avg_sq"):
            blocks = self.views(getattr(self, key)).values()
            setattr(self, key, torch.cat([block.index_select(0, index).reshape(-1) for block in blocks]))
        self.members = len(index)
        self._derived()


def stack_members(states: Sequence[Any], trainable: Sequence[str]) -> tuple[dict, list[FlatParameters], int]:
    """The members' (each with `.model` and its torch `.optimizer`) parameters stacked: the frozen
    ones as (members, *shape) tensors, the trainable ones with their AdamW moments as flat tensors
    per (optimizer group, dtype); and the optimizer step the members are at (all at one)."""
    models = [dict(s.model.named_parameters()) for s in states]
    by_id = {id(p): name for name, p in models[0].items()}
    group_of = {by_id[id(p)]: i for i, group in enumerate(states[0].optimizer.param_groups) for p in group["params"]}
    frozen = {
        name: torch.stack([m[name].detach() for m in models]).clone() for name in models[0] if name not in trainable
    }
    steps = set()
    moments: dict[str, list[dict]] = {}
    for name in trainable:
        moments[name] = [s.optimizer.state.get(m[name], {}) for s, m in zip(states, models)]
        steps |= {int(x["step"]) if "step" in x else 0 for x in moments[name]}
    if len(steps) > 1:
        raise ValueError(f"members at different optimizer steps {sorted(steps)}")
    layout: dict[tuple, list[str]] = {}  # (optimizer group, dtype) -> its parameters, in order
    for name in trainable:
        layout.setdefault((group_of[name], models[0][name].dtype), []).append(name)
    flats = []
    for (group, _), names in layout.items():

        def stacks(member_tensor: Callable[[int, str], torch.Tensor], names: list[str] = names) -> list[torch.Tensor]:
            return [torch.stack([member_tensor(i, name).detach() for i in range(len(models))]) for name in names]

        def moment(key: str) -> Callable[[int, str], torch.Tensor]:
            return lambda i, name: moments[name][i].get(key, torch.zeros_like(models[i][name]))

        blocks = {
            "param": stacks(lambda i, name: models[i][name]),
            "exp_avg": stacks(moment("exp_avg")),
            "exp_avg_sq": stacks(moment("exp_avg_sq")),
        }
        flats.append(FlatParameters(group, names, [tuple(models[0][name].shape) for name in names], blocks))
    return frozen, flats, steps.pop() if steps else 0


def stacked_views(
    frozen: dict[str, torch.Tensor], flats: Sequence[FlatParameters]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter's (members, *shape) stack (the trainable ones leaves of autograd over the
    flat tensors, the frozen ones as they are) and the two AdamW moments' views, by name."""
    params, exp_avg, exp_avg_sq = dict(frozen), {}, {}
    for flat in flats:
        params.update(flat.leaves())
        exp_avg.update(flat.views(flat.exp_avg))
        exp_avg_sq.update(flat.views(flat.exp_avg_sq))
    return params, exp_avg, exp_avg_sq


@torch.no_grad()
def adamw_update(
    flat: FlatParameters,
    grad: torch.Tensor,
    moments: tuple[torch.Tensor, torch.Tensor],
    lr: torch.Tensor,
    decay: torch.Tensor,
    corrections: tuple[torch.Tensor | float, torch.Tensor | float],
    betas: tuple[float, float],
    eps: float,
    param: torch.Tensor | None = None,
) -> None:
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments) of one flat group,
    in place, with each member's learning rate `lr` and weight decay `decay` (one value a member)
    along the member axis; `corrections`: 1 - beta1^t and sqrt(1 - beta2^t)."""
    param = flat.param if param is None else param
    exp_avg, exp_avg_sq = moments
    beta1, beta2 = betas
    correction1, correction2_sqrt = corrections
    param.mul_((1 - lr * decay).index_select(0, flat.member_of))
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / correction2_sqrt).add_(eps)
    param.sub_((lr / correction1).index_select(0, flat.member_of) * exp_avg / denom)


@torch.no_grad()
def write_back(states: Sequence[Any], params: dict[str, torch.Tensor], moments: tuple[dict, dict], step: int) -> None:
    """Each member's slice of the stacked weights and AdamW moments written into its own model and
    optimizer, in the layout of torch's AdamW (so its checkpoint is the unbatched run's)."""
    exp_avg, exp_avg_sq = moments
    for i, state in enumerate(states):
        own = dict(state.model.named_parameters())
        for name, stacked in params.items():
            own[name].copy_(stacked[i])
        if not step:
            continue
        fused = bool(state.optimizer.param_groups[0].get("fused"))
        for name in exp_avg:
            p = own[name]
            state.optimizer.state[p] = {
                "step": torch.tensor(float(step), dtype=torch.float32, device=p.device)
                if fused
                else torch.tensor(float(step)),
                "exp_avg": exp_avg[name][i].clone(),
                "exp_avg_sq": exp_avg_sq[name][i].clone(),
            }
