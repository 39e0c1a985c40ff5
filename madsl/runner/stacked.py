"""The members of a grid group as one model: parameters stacked along a leading member
axis, every member's forward and backward in one `torch.func.vmap(functional_call)`, and
AdamW applied to the stacked tensors with each member's own learning rate (its cosine
schedule) and weight decay.

Used by `madsl.runner.grid` for models whose every layer declares `stacks = True` (a class
attribute of the layer module, covering its submodules): its forward is exact under vmap
over stacked parameters, because each op either has a vmap batching rule or a *member
fold* (`madsl.kernels.member_fold`: SDPA, the selective scan, causal-conv1d, GLA and fla's
kernels run once for all members, with the member axis folded into their batch or channel
axis). Every layer in madsl.layers declares it; a new layer trains in lockstep until it
does (tests/test_grid.py checks the declaration against a loop over members). The model's
containers, heads and torch.nn building blocks are taken as they come.

Each member keeps its unbatched `RunState` as the record of what it is: before an
evaluation, a checkpoint or its end, its slice of the stacked weights and Adam moments is
written back into that state's model and optimizer (`sync`), so evaluation, best-epoch
selection, checkpoints (in the unbatched format) and results are the unbatched code's.
The arithmetic is the same as the unbatched run's up to floating-point association (vmap
reorders no reduction of a member, but batched matmuls may block differently): results
agree to fp32 rounding, not bit for bit.
"""
from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from madsl.runner.precision import autocast

# Containers and building blocks that batch under vmap as they are (their children are checked).
GENERIC_MODULES = ("torch.nn.modules.", "madsl.model", "madsl.runner.heads")


def _batches(module: torch.nn.Module) -> bool:
    """A module stacks if it declares so (for itself and its submodules: a layer owns its
    filters and projections), or is a generic container whose children all stack."""
    declared = getattr(type(module), "stacks", None)
    if declared is not None:
        return bool(declared)
    return type(module).__module__.startswith(GENERIC_MODULES) and all(_batches(c) for c in module.children())


def batchable(models: Sequence[torch.nn.Module]) -> bool:
    """Whether these members can train as one stacked model: same structure, class outputs
    (regression masks select a data-dependent number of positions, which vmap cannot), and
    every layer declaring `stacks`."""
    first = models[0]
    shapes = [{k: (v.shape, v.requires_grad) for k, v in m.named_parameters()} for m in models]
    return (getattr(first, "kind", None) == "classes" and _batches(first)
            and all(s == shapes[0] for s in shapes))


class StackedMembers:
    """Members' weights and AdamW moments stacked; trains them one step at a time, together."""

    def __init__(self, states: Sequence[Any]):
        self.states = list(states)  # RunStates, all at the same epoch and step
        self.template = states[0].model
        self.names = [name for name, p in self.template.named_parameters()]
        self.trainable = [name for name, p in self.template.named_parameters() if p.requires_grad]
        self.buffers = dict(self.template.named_buffers())
        first_groups = states[0].optimizer.param_groups
        self.betas, self.eps = first_groups[0]["betas"], first_groups[0]["eps"]
        self.params, self.exp_avg, self.exp_avg_sq = {}, {}, {}
        self.step_count = 0
        self._load()

    # --- stacking and writing back ----------------------------------------------------------
    def _load(self) -> None:
        """Stack the members' current weights and optimizer moments (fresh or resumed)."""
        models = [dict(s.model.named_parameters()) for s in self.states]
        for name in self.names:
            stacked = torch.stack([m[name].detach() for m in models]).clone()
            self.params[name] = stacked.requires_grad_(name in self.trainable)
        steps = set()
        for name in self.trainable:
            moments = [s.optimizer.state.get(m[name], {}) for s, m in zip(self.states, models)]
            steps |= {int(x["step"]) if "step" in x else 0 for x in moments}
            self.exp_avg[name] = torch.stack([x.get("exp_avg", torch.zeros_like(m[name]))
                                              for x, m in zip(moments, models)]).detach().clone()
            self.exp_avg_sq[name] = torch.stack([x.get("exp_avg_sq", torch.zeros_like(m[name]))
                                                 for x, m in zip(moments, models)]).detach().clone()
        if len(steps) > 1:
            raise ValueError(f"members at different optimizer steps {sorted(steps)}")
        self.step_count = steps.pop() if steps else 0
        # the optimizer group of each parameter (build_optimizer: decayed or not); members share the layout
        by_id = {id(p): name for name, p in models[0].items()}
        self.group_of = {by_id[id(p)]: index for index, group in enumerate(self.states[0].optimizer.param_groups)
                         for p in group["params"]}

    def sync(self) -> None:
        """Write each member's slice of the weights and moments back into its RunState, in the
        layout of torch's AdamW (so its checkpoint is the unbatched run's)."""
        with torch.no_grad():
            for i, state in enumerate(self.states):
                params = dict(state.model.named_parameters())
                for name in self.names:
                    params[name].copy_(self.params[name][i])
                for name in self.trainable:
                    if self.step_count:
                        p = params[name]
                        state.optimizer.state[p] = {
                            "step": torch.tensor(float(self.step_count), dtype=torch.float32, device=p.device)
                            if _fused(state.optimizer) else torch.tensor(float(self.step_count)),
                            "exp_avg": self.exp_avg[name][i].clone(), "exp_avg_sq": self.exp_avg_sq[name][i].clone()}

    def keep(self, indices: Sequence[int]) -> None:
        """Only these members train on (the others finished): their slices, restacked."""
        index = torch.tensor(list(indices), device=next(iter(self.params.values())).device)
        self.states = [self.states[i] for i in indices]
        for table in (self.params, self.exp_avg, self.exp_avg_sq):
            for name, tensor in table.items():
                table[name] = tensor.detach().index_select(0, index).requires_grad_(tensor.requires_grad)

    # --- one step -------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, precision: str, loss_fn: Callable) -> tuple:
        """Forward and backward of every member on its batch (x, y: member axis first), then
        each member's AdamW step at its current learning rate. Returns (outputs, loss sums)."""
        model, buffers = self.template, self.buffers

        def member_loss(params, inputs, targets):
            with autocast(precision, inputs.device):
                outputs = torch.func.functional_call(model, (params, buffers), (inputs,))
            loss, loss_sum = loss_fn(model, outputs, targets)
            return loss + model.aux_loss(), outputs, loss_sum  # as train_epoch: MoE's balancing loss

        losses, outputs, loss_sums = torch.func.vmap(member_loss)(self.params, x, y)
        _forget_aux_losses(model)
        for name in self.trainable:
            self.params[name].grad = None
        losses.sum().backward()
        self._adamw()
        return outputs.detach(), loss_sums.detach()

    @torch.no_grad()
    def _adamw(self) -> None:
        """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), with
        the learning rate and weight decay of each member along the member axis."""
        self.step_count += 1
        beta1, beta2 = self.betas
        correction1 = 1 - beta1 ** self.step_count
        correction2_sqrt = math.sqrt(1 - beta2 ** self.step_count)
        lrs = [s.optimizer.param_groups[0]["lr"] for s in self.states]  # the schedule sets every group's lr
        for name in self.trainable:
            p, grad = self.params[name], self.params[name].grad
            shape = (-1,) + (1,) * (p.ndim - 1)
            lr = torch.tensor(lrs, dtype=p.dtype, device=p.device).view(shape)
            wd = torch.tensor([self._decay(s, name) for s in self.states], dtype=p.dtype, device=p.device).view(shape)
            p.mul_(1 - lr * wd)
            self.exp_avg[name].lerp_(grad, 1 - beta1)
            self.exp_avg_sq[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (self.exp_avg_sq[name].sqrt() / correction2_sqrt).add_(self.eps)
            p.sub_(lr / correction1 * self.exp_avg[name] / denom)

    def _decay(self, state: Any, name: str) -> float:
        """The member's weight decay for this parameter (its optimizer group's: 0 for biases, norms, ...)."""
        return state.optimizer.param_groups[self.group_of[name]]["weight_decay"]


@contextmanager
def schedulers_without_steps() -> Iterator[None]:
    """The members' own optimizers never step (the stack does): their schedulers' warning
    about it is silenced while they step (per step, or per epoch under mad-lab's conventions)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        yield


def _forget_aux_losses(model: torch.nn.Module) -> None:
    """Drop the members' auxiliary losses the vmapped forward left on the template's layers
    (tensors of a finished vmap level; the template is the first member's own model)."""
    for module in model.modules():
        if isinstance(getattr(module, "aux_loss", None), torch.Tensor):
            module.aux_loss = None


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.param_groups[0].get("fused"))


def train_stacked_epoch(stack: StackedMembers, datas: Sequence[Any], hooks: Sequence[Any],
                        checkpoint: Callable[[], None], checkpoint_due: Callable[[], bool],
                        should_stop: Callable[[], bool], interrupted: type,
                        epoch_order: Callable[[int, int, int], torch.Tensor]) -> None:
    """Train the rest of the members' (common) epoch from their (common) step, as
    train.train_epoch does for one run: scheduler steps, train metrics and progress per
    member; `checkpoint()` (after writing the members back) when due mid-epoch and on a
    stop, which then raises `interrupted`. Ends with the members written back."""
    from madsl.runner.train import MAD_LAB, _loss

    states = stack.states
    batch_size = states[0].settings.batch_size
    per_step_schedule = states[0].settings.conventions != MAD_LAB  # mad-lab steps it per epoch (epoch_metrics)
    orders: dict[tuple, torch.Tensor] = {}  # members with the same data and seed share an order
    for data, state in zip(datas, states):
        key = (id(data), state.settings.seed)
        if key not in orders:
            orders[key] = epoch_order(data.train_x.shape[0], state.settings.seed, state.epoch).to(data.train_x.device)
    started = time.monotonic()

    def bank_time() -> None:
        nonlocal started
        elapsed = time.monotonic() - started
        for state in states:
            state.epoch_seconds += elapsed
            state.train_seconds += elapsed
        started = time.monotonic()

    def save() -> None:
        bank_time()
        stack.sync()
        checkpoint()

    with schedulers_without_steps():
        while states[0].step < states[0].steps_per_epoch:
            if should_stop():
                save()
                raise interrupted(f"stopped at epoch {states[0].epoch + 1}, step {states[0].step}")
            window = slice(states[0].step * batch_size, (states[0].step + 1) * batch_size)
            indices = [orders[(id(data), state.settings.seed)][window] for data, state in zip(datas, states)]
            x = torch.stack([data.train_x[index] for data, index in zip(datas, indices)])
            y = torch.stack([data.train_y[index] for data, index in zip(datas, indices)])
            outputs, loss_sums = stack.step(x, y, states[0].settings.precision, _loss)
            for i, (state, member_hooks) in enumerate(zip(states, hooks)):
                if per_step_schedule:  # the member's cosine schedule, on its own optimizer's groups
                    state.scheduler.step()
                state.train_metrics.update(outputs[i], y[i], loss_sums[i])
                state.step += 1
                if member_hooks.on_progress is not None:
                    member_hooks.on_progress(state.epoch + 1, state.step, state.steps_per_epoch)
            if checkpoint_due() and states[0].step < states[0].steps_per_epoch:
                save()
    bank_time()
    stack.sync()
