"""Pretraining runs of one shape trained as one stacked model: seed replicates, learning-rate and
weight-decay ladders, and budgets that differ only in length.

`PretrainStack` holds its members' weights along a leading member axis and takes every member's
step at once: one `torch.func.vmap(functional_call)` forward and backward, each member's gradient
clipped by its own norm, AdamW along the member axis with each member's learning rate (its own
schedule) and weight decay (madsl.runner.batched.flat). `pretrain_stack` drives it: each member
reads its own batches (its seed's data order), is scored at its own evaluation steps, stops at its
own budget (then the stack goes on without it) and keeps its unbatched `PretrainState` as the
record of what it is: before a checkpoint the stack writes each member's slice back into that
state's model and optimizer, so a member's checkpoint, history and result are a one-by-one run's,
and a stopped stack resumes member by member.

The arithmetic is a one-by-one run's up to floating-point association: a batched matmul may
block its sums differently, and the stack's AdamW is torch's formula in separate ops where a run
alone uses the fused kernel; on the CPU in fp32 the members' losses agree with one-by-one runs
within 1.3e-7 relative for every spec in specs/paper/ at width 16 (tests/test_pretrain_stack.py
holds them to 1e-5), not bit for bit.

What a stack saves is a step's per-tensor work (the optimizer's, the dispatcher's), paid once for
all members; on a CPU that pays only for the smallest models (benchmarks/stacked_pretrain.py,
madsl.scaling.api.CPU_STACK_MAX_DIM).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from madsl.runner.batched.flat import adamw_update, stack_members, stacked_views, write_back
from madsl.runner.batched.stacked import batchable_layers, forget_aux_losses
from madsl.runner.pretrain.loop import PretrainState, TextBatches, as_tokens, record_evaluation
from madsl.runner.train.loop import RunInterrupted, TrainHooks
from madsl.runner.train.precision import autocast


def stackable(states: Sequence[PretrainState]) -> bool:
    """Whether these runs can train as one stacked model: one model structure whose every layer
    stacks (madsl.runner.batched.stacked), at one step, with the settings a step shares."""
    first = states[0]
    shapes = [{k: (v.shape, v.requires_grad) for k, v in s.model.named_parameters()} for s in states]
    shared = {(s.step, s.settings.seq_len, s.settings.batch_size, s.settings.precision) for s in states}
    betas = {(g["betas"], g["eps"]) for s in states for g in s.optimizer.param_groups}
    return (
        len(shared) == 1 and len(betas) == 1 and batchable_layers(first.model) and all(s == shapes[0] for s in shapes)
    )


class PretrainStack:
    """Members' weights and AdamW moments stacked; one training step or evaluation for all at once."""

    def __init__(self, states: Sequence[PretrainState]):
        self.states = list(states)
        self.template = states[0].model
        self.trainable = [name for name, p in self.template.named_parameters() if p.requires_grad]
        self.buffers = dict(self.template.named_buffers())
        group = states[0].optimizer.param_groups[0]
        self.betas, self.eps = tuple(group["betas"]), group["eps"]
        self.precision = states[0].settings.precision
        self.frozen, self.flats, self.step_count = stack_members(self.states, self.trainable)
        self._restart()

    def _restart(self) -> None:
        """The parameters as views of the flat tensors, and the members' constants."""
        self.params, self.exp_avg, self.exp_avg_sq = stacked_views(self.frozen, self.flats)
        groups = range(len(self.states[0].optimizer.param_groups))
        self.decay = [torch.tensor([s.optimizer.param_groups[g]["weight_decay"] for s in self.states]) for g in groups]
        self.clip = torch.tensor([s.settings.grad_clip for s in self.states], dtype=torch.float32)

    def keep(self, indices: Sequence[int]) -> None:
        """Only these members train on (the others finished; `sync` wrote them back)."""
        index = torch.tensor(list(indices))
        self.states = [self.states[i] for i in indices]
        self.frozen = {name: tensor.index_select(0, index) for name, tensor in self.frozen.items()}
        for flat in self.flats:
            flat.keep(index)
        self._restart()

    def sync(self) -> None:
        """Each member's slice of the weights and moments written back into its PretrainState."""
        write_back(self.states, self.params, (self.exp_avg, self.exp_avg_sq), self.step_count)

    def _member_loss(self) -> Callable:
        model, buffers, precision = self.template, self.buffers, self.precision

        def member_loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with autocast(precision, x.device):
                logits = torch.func.functional_call(model, (params, buffers), (x,))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            return loss + model.aux_loss(), loss  # as train_step: MoE's balancing loss is trained, not reported

        return member_loss

    def step(self, x: torch.Tensor, y: torch.Tensor) -> list[float]:
        """One optimizer step of every member on its batch (x, y: members first) at its own
        learning rate; the members' train losses."""
        lrs = torch.tensor([s.settings.lr_at(s.step) for s in self.states], dtype=torch.float32)
        totals, losses = torch.func.vmap(self._member_loss())(self.params, x, y)
        forget_aux_losses(self.template)
        for flat in self.flats:
            flat.grad.zero_()  # the parameters' .grad are views of it: the backward adds into them
        totals.sum().backward()
        self._clip()
        self.step_count += 1
        beta1, beta2 = self.betas
        corrections = (1 - beta1**self.step_count, math.sqrt(1 - beta2**self.step_count))
        for flat in self.flats:
            moments = (flat.exp_avg, flat.exp_avg_sq)
            adamw_update(flat, flat.grad, moments, lrs, self.decay[flat.group], corrections, self.betas, self.eps)
        return losses.detach().tolist()

    @torch.no_grad()
    def _clip(self) -> None:
        """Each member's gradient clipped to its grad_clip by its own global norm, as
        torch.nn.utils.clip_grad_norm_ clips one run's (a member with grad_clip 0 is not clipped)."""
        norms = [
            torch.linalg.vector_norm(view.reshape(view.shape[0], -1), dim=1)
            for flat in self.flats
            for view in flat.views(flat.grad).values()
        ]
        total = torch.linalg.vector_norm(torch.stack(norms), dim=0)
        coef = torch.where(self.clip > 0, (self.clip / (total + 1e-6)).clamp(max=1.0), torch.ones_like(total))
        for flat in self.flats:
            flat.grad.mul_(coef.index_select(0, flat.member_of))

    @torch.no_grad()
    def evaluate(self, members: Sequence[int], batches: Any) -> list[dict[str, float]]:
        """These members scored on the validation windows (shared: one text, length and batch
        size), as madsl.runner.pretrain.loop.evaluate_text scores one run."""
        index = torch.tensor(list(members))
        params = {name: tensor.detach().index_select(0, index) for name, tensor in self.params.items()}
        model, buffers, precision, count = self.template, self.buffers, self.precision, len(members)

        def member_scores(params: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with autocast(precision, x.device):
                logits = torch.func.functional_call(model, (params, buffers), (x,))
            logits = logits.float().reshape(-1, logits.shape[-1])
            return F.cross_entropy(logits, y.reshape(-1), reduction="sum"), (logits.argmax(-1) == y.reshape(-1)).sum()

        was_training = model.training
        model.eval()
        loss_sums, correct, tokens = [0.0] * count, [0] * count, 0
        try:
            for x_np, y_np in batches:
                x, y = as_tokens(x_np, index.device), as_tokens(y_np, index.device)
                sums, hits = torch.func.vmap(member_scores, in_dims=(0, None, None))(params, x, y)
                forget_aux_losses(model)
                for i in range(count):
                    loss_sums[i] += float(sums[i])
                    correct[i] += int(hits[i])
                tokens += y.numel()
        finally:
            model.train(was_training)
        out = []
        for loss_sum, right in zip(loss_sums, correct):
            loss = loss_sum / max(tokens, 1)
            out.append({"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": right / max(tokens, 1)})
        return out


def pretrain_stack(
    states: Sequence[PretrainState],
    datas: Sequence[TextBatches],
    hooks: Sequence[TrainHooks],
    save: Callable[[PretrainState, bool], None],
    device: torch.device,
) -> None:
    """Train these runs (all at one step: `stackable`) together until each reaches its budget or
    diverges; `save(state, finished)` writes a member's checkpoint (with its result once finished)
    after its slice is written back. A stop (any member's hooks.should_stop) saves every member
    still training and raises RunInterrupted."""
    stack, active = PretrainStack(states), list(range(len(states)))
    schedules = [s.settings.evaluation_steps() for s in states]
    every = min(h.checkpoint_every_s for h in hooks)
    last_save = time.monotonic()
    since_eval = [last_save] * len(states)
    while active:
        if any(hooks[i].should_stop is not None and hooks[i].should_stop() for i in active):
            stack.sync()
            for i in active:
                save(states[i], False)
            raise RunInterrupted(f"stopped at step {states[active[0]].step}")
        started = time.monotonic()
        batches = [datas[i].train_batch(states[i].step) for i in active]
        x = torch.stack([as_tokens(b[0], device) for b in batches])
        y = torch.stack([as_tokens(b[1], device) for b in batches])
        losses = stack.step(x, y)
        share = (time.monotonic() - started) / len(active)  # the step's time, shared by its members
        for loss, i in zip(losses, active):
            state = states[i]
            state.loss_sum, state.loss_steps, state.step = state.loss_sum + loss, state.loss_steps + 1, state.step + 1
            state.train_seconds += share
            if hooks[i].on_progress is not None:
                hooks[i].on_progress(len(state.history) + 1, state.step, state.settings.steps)
        due = [j for j, i in enumerate(active) if states[i].step in schedules[i] or not math.isfinite(losses[j])]
        if due:
            for j, evaluation in zip(due, stack.evaluate(due, datas[active[due[0]]].eval_batches())):
                i = active[j]
                metrics = record_evaluation(states[i], evaluation, time.monotonic() - since_eval[i])
                since_eval[i] = time.monotonic()
                if hooks[i].on_epoch is not None:
                    hooks[i].on_epoch(metrics)
        done = [j for j, i in enumerate(active) if states[i].finished]
        if done or (due and every == 0) or time.monotonic() - last_save > every:
            stack.sync()
            for j, i in enumerate(active):
                save(states[i], j in done)
            last_save = time.monotonic()
        if done:
            remaining = [j for j in range(len(active)) if j not in done]
            if remaining:
                stack.keep(remaining)
            active = [active[j] for j in remaining]
