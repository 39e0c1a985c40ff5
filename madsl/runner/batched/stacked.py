"""The members of a grid group as one model: parameters stacked along a leading member
axis, every member's forward and backward in one `torch.func.vmap(functional_call)`,
AdamW applied to the stacked tensors with each member's own learning rate (its cosine
schedule) and weight decay, and every member's evaluation in one vmapped forward per
test batch.

Used by `madsl.runner.batched.grid` for models whose every layer declares `stacks = True` (a class
attribute of the layer module, covering its submodules): its forward is exact under vmap
over stacked parameters, because each op either has a vmap batching rule or a *member
fold* (`madsl.kernels.member_fold`: SDPA, the selective scan, causal-conv1d, GLA and fla's
kernels run once for all members, with the member axis folded into their batch or channel
axis). Every layer in madsl.layers declares it; a new layer trains in lockstep until it
does (tests/test_grid.py checks the declaration against a loop over members). The model's
containers, heads and torch.nn building blocks are taken as they come.

Each member keeps its unbatched `RunState` as the record of what it is: before a
checkpoint and at the end of each epoch, its slice of the stacked weights, Adam moments and
train-metric sums is written back into that state's model, optimizer and metrics (`sync`),
so best-epoch selection, checkpoints (in the unbatched format) and results are the
unbatched code's; the stacked evaluation keeps each member's batches and metrics.
The arithmetic is the same as the unbatched run's up to floating-point association (vmap
reorders no reduction of a member, but batched matmuls may block differently): results
agree to fp32 rounding, not bit for bit.

A step and an evaluation batch are each a fixed sequence of device work on tensors that
live as long as the stack, replayed as a CUDA graph with `--cuda-graphs`
(`madsl.runner.batched.replay`); the trainable weights, gradients and Adam moments are flat
tensors per optimizer group (`madsl.runner.batched.flat`). With `compiled`
(`MADSL_COMPILE_STACKED=1`, opt-in), each is first traced and compiled into fused kernels
(`madsl.runner.batched.compile`), which a CUDA graph then replays the same way. An epoch of
the stack: `madsl.runner.batched.stacked_epoch`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from madsl.conventions import MAD_LAB
from madsl.runner.batched import compile as stacked_compile
from madsl.runner.batched.flat import FlatParameters, adamw_update, stack_members, stacked_views, write_back
from madsl.runner.batched.replay import HostUpload, ReplayedStep
from madsl.runner.train.metrics import MetricAccumulator, eval_batch_size, metric_increments, task_loss
from madsl.runner.train.precision import autocast

# Containers and building blocks that batch under vmap as they are (their children are checked).
GENERIC_MODULES = ("torch.nn.modules.", "madsl.model", "madsl.runner.train.heads")


def batchable_layers(module: torch.nn.Module) -> bool:
    """A module stacks if it declares so (for itself and its submodules: a layer owns its
    filters and projections), or is a generic container whose children all stack."""
    declared = getattr(type(module), "stacks", None)
    if declared is not None:
        return bool(declared)
    return type(module).__module__.startswith(GENERIC_MODULES) and all(batchable_layers(c) for c in module.children())


def batchable(models: Sequence[torch.nn.Module]) -> bool:
    """Whether these members can train as one stacked model: same structure, class outputs
    (regression masks select a data-dependent number of positions, which vmap cannot), and
    every layer declaring `stacks`."""
    first = models[0]
    shapes = [{k: (v.shape, v.requires_grad) for k, v in m.named_parameters()} for m in models]
    return getattr(first, "kind", None) == "classes" and batchable_layers(first) and all(s == shapes[0] for s in shapes)


class StackedMembers:
    """Members' weights and AdamW moments stacked; trains them one step at a time, together,
    and evaluates them together (`graphs`: replaying both as CUDA graphs on a CUDA device)."""

    def __init__(self, states: Sequence[Any], graphs: bool = False, compiled: bool | None = None):
        self.states = list(states)  # RunStates, all at the same epoch and step
        self.template = states[0].model
        self.names = [name for name, p in self.template.named_parameters()]
        self.trainable = [name for name, p in self.template.named_parameters() if p.requires_grad]
        self.buffers = dict(self.template.named_buffers())
        first_groups = states[0].optimizer.param_groups
        self.betas, self.eps = first_groups[0]["betas"], first_groups[0]["eps"]
        self.settings = states[0].settings  # what members share: precision, conventions, batch size
        # what the members' metrics are: output kind, classes, per-batch aggregation (mad-lab)
        self.metrics = (states[0].train_metrics.kind, states[0].num_classes, self.settings.conventions == MAD_LAB)
        self.step_count = 0
        self.graphs = graphs
        # the step and evaluation batch compiled into fused kernels (madsl.runner.batched.compile);
        # opt-in, by default from MADSL_COMPILE_STACKED=1
        self.compiled = stacked_compile.requested() if compiled is None else compiled
        self._load()

    # --- stacking and writing back ----------------------------------------------------------
    def _load(self) -> None:
        """Stack the members' current weights and optimizer moments (fresh or resumed)."""
        self.frozen, self.flats, self.step_count = stack_members(self.states, self.trainable)
        self._restart()

    def _restart(self) -> None:
        """The parameters as views of the flat tensors; per-member constants for the current
        members; buffers and graphs made anew."""
        self.params, self.exp_avg, self.exp_avg_sq = stacked_views(self.frozen, self.flats)
        device = next(iter(self.params.values())).device
        # each member's weight decay per optimizer group (0 for biases, norms, ... under madsl's conventions)
        self.decay = [
            torch.tensor(
                [s.optimizer.param_groups[g]["weight_decay"] for s in self.states], dtype=torch.float32, device=device
            )
            for g in range(len(self.states[0].optimizer.param_groups))
        ]
        # the members' learning rates, then AdamW's two bias corrections: uploaded before each step
        self.hyper = torch.zeros(len(self.states) + 2, dtype=torch.float32, device=device)
        self._upload_hyper = HostUpload(self.hyper)
        self.train_sums: dict[str, torch.Tensor] | None = None  # the epoch's train-metric sums (load_metrics)
        self.eval_sums: dict[str, torch.Tensor] | None = None  # an evaluation's metric sums
        train_compute, eval_compute = self._train_compute, self._eval_compute
        if self.compiled:  # new members (keep), new constants: compiled anew
            train_compute, eval_compute = self._compiled_train_compute(), self._compiled_eval_compute()
        self._train_step = ReplayedStep(train_compute, device, self.graphs, "training step")
        self._eval_batch = ReplayedStep(eval_compute, device, self.graphs, "evaluation")

    def sync(self) -> None:
        """Write each member's slice of the weights, moments and the epoch's train-metric sums back into its
        RunState, in the layout of torch's AdamW (so its checkpoint is the unbatched run's)."""
        write_back(self.states, self.params, (self.exp_avg, self.exp_avg_sq), self.step_count)
        if self.train_sums is not None:  # the epoch's sums so far are the stack's
            for i, state in enumerate(self.states):
                state.train_metrics.load_state_dict({key: sums[i] for key, sums in self.train_sums.items()})

    def load_metrics(self) -> None:
        """Continue each member's train-metric sums (a resumed epoch's, or the zeros of a new
        one) in the stack: one chain of additions, as unbatched, so resuming changes no digit."""
        members = [s.train_metrics for s in self.states]
        sums = {
            key: torch.stack([getattr(m, key).to(self.hyper.device) for m in members]) for key in MetricAccumulator.SUMS
        }
        if self.train_sums is None:
            self.train_sums = sums
        else:
            for key, value in sums.items():
                self.train_sums[key].copy_(value)  # in place: a captured step adds into these tensors

    def keep(self, indices: Sequence[int]) -> None:
        """Only these members train on (the others finished; written back by `sync`): their
        slices, restacked."""
        index = torch.tensor(list(indices), device=next(iter(self.params.values())).device)
        self.states = [self.states[i] for i in indices]
        self.frozen = {name: tensor.index_select(0, index) for name, tensor in self.frozen.items()}
        for flat in self.flats:
            flat.keep(index)
        self._restart()

    # --- training -------------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Forward and backward of every member on its batch (x, y: member axis first), each
        member's AdamW step at its current learning rate, and its train-metric sums."""
        self.step_count += 1
        lrs = [s.optimizer.param_groups[0]["lr"] for s in self.states]  # the schedule sets every group's lr
        beta1, beta2 = self.betas
        self._upload_hyper(lrs + [1 - beta1**self.step_count, math.sqrt(1 - beta2**self.step_count)])
        self._train_step(x, y)

    def _member_forward(self, cache: bool) -> Callable:
        """One member's outputs, loss and summed loss, a function of its parameters (for vmap)."""
        model, buffers, precision = self.template, self.buffers, self.settings.precision

        def member_forward(params, inputs, targets):
            with autocast(precision, inputs.device, cache=cache):
                outputs = torch.func.functional_call(model, (params, buffers), (inputs,))
            loss, loss_sum = task_loss(model, outputs, targets)
            return loss + model.aux_loss(), outputs, loss_sum  # as train_epoch: MoE's balancing loss

        return member_forward

    def _train_compute(self, inputs: torch.Tensor, targets: torch.Tensor, cache: bool) -> None:
        """A step's device work, from its input buffers and `hyper`."""
        losses, outputs, loss_sums = torch.func.vmap(self._member_forward(cache))(self.params, inputs, targets)
        forget_aux_losses(self.template)
        for flat in self.flats:
            flat.grad.zero_()  # the parameters' .grad are views of it: the backward adds into them
        losses.sum().backward()
        self._adamw()
        self._add_sums(self.train_sums, outputs.detach(), targets, loss_sums.detach())

    @torch.no_grad()
    def _adamw(self) -> None:
        """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), with
        the learning rate and weight decay of each member along the member axis: on the flat
        tensors, a few ops for all parameters of an optimizer group."""
        for flat in self.flats:
            self._adamw_update(flat, self.hyper, flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq)

    def _adamw_update(
        self,
        flat: FlatParameters,
        hyper: torch.Tensor,
        param: torch.Tensor,
        grad: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
    ) -> None:
        """One flat group's update, in place (the flat's own tensors, or a compiled step's arguments)."""
        members = len(self.states)
        corrections = (hyper[members], hyper[members + 1])
        decay = self.decay[flat.group]
        adamw_update(
            flat, grad, (exp_avg, exp_avg_sq), hyper[:members], decay, corrections, self.betas, self.eps, param
        )

    @torch.no_grad()
    def _add_sums(
        self, sums: dict[str, torch.Tensor], outputs: torch.Tensor, targets: torch.Tensor, loss_sums: torch.Tensor
    ) -> None:
        """Add one batch of every member to metric sums (in place: a captured step adds into them)."""
        for key, value in metric_increments(*self.metrics, outputs, targets, loss_sums).items():
            sums[key].add_(value)

    # --- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, datas: Sequence[Any]) -> list[dict[str, float | None]]:
        """Every member on its test split, as train.evaluate does for one run (its batches,
        its metrics), in one vmapped forward per batch: the members' evaluations, in order."""
        test_x = [data.test_x for data in datas]
        test_y = [data.test_y for data in datas]
        members, batch = len(self.states), eval_batch_size(self.settings)
        if self.eval_sums is None:
            self.eval_sums = {
                key: torch.stack([getattr(MetricAccumulator(*self.metrics), key)] * members).to(self.hyper.device)
                for key in MetricAccumulator.SUMS
            }
        for sums in self.eval_sums.values():
            sums.zero_()  # in place: a captured evaluation adds into these tensors
        was_training = self.template.training
        self.template.eval()
        try:
            for start in range(0, test_x[0].shape[0], batch):
                rows = [slice(start, start + batch)] * members
                self._eval_batch(member_batch(test_x, rows), member_batch(test_y, rows))
        finally:
            self.template.train(was_training)
        results = []
        for i in range(members):
            accumulator = MetricAccumulator(*self.metrics)
            accumulator.add({key: sums[i] for key, sums in self.eval_sums.items()})
            results.append(accumulator.compute())
        return results

    def _eval_compute(self, inputs: torch.Tensor, targets: torch.Tensor, cache: bool) -> None:
        """An evaluation batch's device work, from its input buffers."""
        with torch.no_grad():
            _, outputs, loss_sums = torch.func.vmap(self._member_forward(cache))(self.params, inputs, targets)
            forget_aux_losses(self.template)
            self._add_sums(self.eval_sums, outputs, targets, loss_sums)

    # --- compiled (opt-in: madsl.runner.batched.compile) --------------------------------------
    def _weights(self, flat_params: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every parameter's (members, *shape) stack, the trainable ones views of these flat tensors."""
        weights = dict(self.frozen)
        for flat, param in zip(self.flats, flat_params):
            weights.update(flat.views(param))
        return weights

    def _compiled_train_compute(self) -> Callable[[torch.Tensor, torch.Tensor, bool], None]:
        """`_train_compute`'s work (forward, backward, AdamW, metric sums) as one compiled
        function of the stack's tensors, updating them in place."""
        flats, keys = len(self.flats), sorted(MetricAccumulator.SUMS)

        def step(*tensors: torch.Tensor) -> None:
            params, exp_avgs, exp_avg_sqs = (tensors[i * flats : (i + 1) * flats] for i in range(3))
            hyper, inputs, targets, *sums = tensors[3 * flats :]
            leaves = [p.detach().requires_grad_() for p in params]
            losses, outputs, loss_sums = torch.func.vmap(self._member_forward(False))(
                self._weights(leaves), inputs, targets
            )
            forget_aux_losses(self.template)
            grads = torch.autograd.grad(losses.sum(), leaves)
            with torch.no_grad():
                for flat, param, grad, exp_avg, exp_avg_sq in zip(self.flats, params, grads, exp_avgs, exp_avg_sqs):
                    self._adamw_update(flat, hyper, param, grad, exp_avg, exp_avg_sq)
                self._add_sums(dict(zip(keys, sums)), outputs.detach(), targets, loss_sums.detach())

        compiled = stacked_compile.CompiledInPlace(step, "training step")

        def compute(inputs: torch.Tensor, targets: torch.Tensor, cache: bool) -> None:
            if not compiled(
                *(f.param for f in self.flats),
                *(f.exp_avg for f in self.flats),
                *(f.exp_avg_sq for f in self.flats),
                self.hyper,
                inputs,
                targets,
                *(self.train_sums[key] for key in keys),
            ):
                self._train_compute(inputs, targets, cache)

        return compute

    def _compiled_eval_compute(self) -> Callable[[torch.Tensor, torch.Tensor, bool], None]:
        """`_eval_compute`'s work (the forward, metric sums) as one compiled function."""
        flats, keys = len(self.flats), sorted(MetricAccumulator.SUMS)

        def batch(*tensors: torch.Tensor) -> None:
            params, (inputs, targets, *sums) = tensors[:flats], tensors[flats:]
            with torch.no_grad():
                _, outputs, loss_sums = torch.func.vmap(self._member_forward(False))(
                    self._weights(params), inputs, targets
                )
                forget_aux_losses(self.template)
                self._add_sums(dict(zip(keys, sums)), outputs, targets, loss_sums)

        compiled = stacked_compile.CompiledInPlace(batch, "evaluation")

        def compute(inputs: torch.Tensor, targets: torch.Tensor, cache: bool) -> None:
            if not compiled(*(f.param for f in self.flats), inputs, targets, *(self.eval_sums[key] for key in keys)):
                self._eval_compute(inputs, targets, cache)

        return compute


def member_batch(splits: Sequence[torch.Tensor], rows: Sequence[Any]) -> torch.Tensor:
    """Each member's rows (a slice or indices) of its split, member axis first; where every
    member reads the same rows of the same split (one seed), they are read once and broadcast."""
    if all(split is splits[0] for split in splits) and all(r is rows[0] for r in rows):
        part = splits[0][rows[0]]
        return part.expand(len(splits), *part.shape)
    return torch.stack([split[r] for split, r in zip(splits, rows)])


def forget_aux_losses(model: torch.nn.Module) -> None:
    """Drop the members' auxiliary losses the vmapped forward left on the template's layers
    (tensors of a finished vmap level; the template is the first member's own model)."""
    for module in model.modules():
        if isinstance(getattr(module, "aux_loss", None), torch.Tensor):
            module.aux_loss = None
