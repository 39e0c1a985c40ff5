"""Mixture-of-experts GLU channel mixer (`MoE`): the torch module of `madsl.primitives.moe`.

    logits = router(x)                                   dim -> experts (a bias where router_bias)
    top    = the `active` largest logits per token; w = softmax over those only
             (normalize_top: false, Jamba: w = their probabilities of the softmax over all experts;
             scores: sigmoid, Nemotron-H / LFM2-MoE: the largest sigmoid scores plus a selection
             bias, weighted by their scores, normalised where normalize_top; times route_scale)
             (every other expert has weight exactly 0; leaky_routing: madsl.layers.routing)
    h_e    = act(gate_e x) * up_e x                      act: silu, gelu (tanh approximation) or relu2
             (gated: false: h_e = act(up_e x), Nemotron-H's squared-ReLU experts)
    out    = sum_{e in top} w_e * down_e(h_e)            dense_down: down_e(h_1, ..., h_experts)

Experts are stacked weights: w_gate, w_up (experts, dim, expert_width) and w_down
(experts, expert_width, dim), or (experts, experts * expert_width, dim) with dense_down
(the MAD reference's MoeMlp: one dense map from all hidden units to experts * dim); no
biases (gated: false, no w_gate). A shared expert (shared_width > 0) is a SwiGLU `shared` on
every token (gated: false, an MLP up -> act -> down of the same activation), its output added
to the routed sum; with shared_gate, scaled first by sigmoid(shared_gate x), a map dim -> 1
without bias (Qwen2-MoE's and Qwen3-Next's shared_expert_gate).

Latent experts (latent_width > 0, NVIDIA-Nemotron-3-Super's LatentMoE as transformers'
NemotronHMoE lays it out): the router reads x; the experts read latent_down x (dim ->
latent_width, no bias) and their weighted sum goes through latent_up (latent_width -> dim, no
bias); the shared expert reads x. The stacked expert weights are then (experts, latent_width,
expert_width) and (experts, expert_width, latent_width).

Two ways to compute the same sum, picked by `dense_dispatch` (set in __init__ from
the sizes, may be overridden):
- dense: every expert on every token as three big matmuls (the experts' widths
  concatenated), then the per-expert outputs weighted by w (zero for unselected
  experts, which therefore contribute exactly nothing). experts/active times the
  FLOPs of the sparse sum, but at MAD sizes (8 experts x 16) all experts together
  are one 128-wide layer and this is several times faster on the CPU than gathering.
- gather: tokens sorted by expert, one small matmul chain per expert on its tokens,
  outputs scattered back. Only the FLOPs of the sparse sum; wins for wide experts.
  (Not with leaky routing or dense_down, where every expert's hidden units are needed,
  nor under vmap: its per-expert token counts are read on the host.)

Load balancing (Switch Transformer): with f_e the fraction of the batch's routing
slots (tokens x active) sent to expert e and P_e the mean router probability
(softmax over all experts), aux_loss = aux_loss_weight * experts * sum_e f_e P_e,
which is aux_loss_weight at perfect balance. Stored in `self.aux_loss` each forward.

Init: what nn.Linear does, per expert: router kaiming-uniform (bound 1/sqrt(dim));
expert weights uniform with bound 1/sqrt(fan_in) (dim for gate/up, down's inputs for down).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels import member_fold
from madsl.layers.routing import choose, route
from madsl.layers.swiglu import SwiGLU
from madsl.primitives.moe import MoE as MoEPrimitive
from madsl.primitives.swiglu import SwiGLU as SwiGLUPrimitive

_ACTIVATIONS = {"silu": F.silu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "relu2": lambda x: F.relu(x).square()}


class _PlainMlp(nn.Module):
    """The shared expert of a MoE whose experts are not gated: down(act(up x)), no biases."""

    def __init__(self, dim: int, width: int, activation):
        super().__init__()
        self.up, self.down = nn.Linear(dim, width, bias=False), nn.Linear(width, dim, bias=False)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.activation(self.up(x)))


class MoE(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: MoEPrimitive):
        super().__init__()
        dim, experts, expert_width = p.dim, p.experts, p.expert_width
        self.dim = dim
        self.expert_dim = p.expert_dim
        self.experts = experts
        self.expert_width = expert_width
        self.active = p.active
        self.aux_loss_weight = float(p.aux_loss_weight)
        self.activation = _ACTIVATIONS[p.activation]
        self.leaky_routing = p.leaky_routing
        self.routing = {"normalize_top": p.normalize_top, "scores": p.scores, "scale": float(p.route_scale)}
        self.dense_down = p.dense_down
        self.router = nn.Linear(dim, experts, bias=p.router_bias)
        width = p.expert_dim  # the model width, or the latent width of latent experts
        self.w_gate = nn.Parameter(torch.empty(experts, width, expert_width)) if p.gated else None
        self.w_up = nn.Parameter(torch.empty(experts, width, expert_width))
        self.w_down = nn.Parameter(torch.empty(experts, p.down_inputs, width))
        # Dense while the extra FLOPs of running every expert are cheap next to the
        # overhead of gathering (benchmarks/throughput_basic.py measures both); always
        # where every expert's hidden units are read (`needs_dense`, whatever this says).
        self.dense_dispatch = experts * expert_width <= 2 * dim or experts <= 2 * p.active
        self.needs_dense = p.leaky_routing or p.dense_down
        self.aux_loss: Tensor | None = None
        self.reset_parameters()
        # built after the routed experts' init, so that a MoE without one draws the same weights
        self.shared = (
            None
            if not p.shared_width
            else _PlainMlp(dim, p.shared_width, self.activation)
            if not p.gated
            else SwiGLU(SwiGLUPrimitive(dim=dim, inner=p.shared_width, multiple_of=1, bias=False))
        )
        # (SwiGLU's multiple_of is read only where inner is null)
        # built last: a MoE without them draws the same weights as before they existed
        self.shared_gate = nn.Linear(dim, 1, bias=False) if p.shared_gate else None
        latent = p.latent_width
        self.latent_down = nn.Linear(dim, latent, bias=False) if latent else None
        self.latent_up = nn.Linear(latent, dim, bias=False) if latent else None
        # a selection bias (DeepSeek-V3's e_score_correction_bias, LFM2-MoE's expert_bias): it picks
        # experts but weighs none; a buffer, set by the checkpoint or a load-balancing rule, never by a gradient
        if p.selection_bias:
            self.register_buffer("selection_bias", torch.zeros(experts))
            self.stacks = False  # the stacked trainer stacks parameters, not buffers
        else:
            self.selection_bias = None

    def reset_parameters(self) -> None:
        self.router.reset_parameters()
        width = self.expert_dim
        for weight, fan_in in ((self.w_gate, width), (self.w_up, width), (self.w_down, self.w_down.shape[1])):
            if weight is None:  # not gated
                continue
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(weight, -bound, bound)

    def __getstate__(self) -> dict:
        # The last aux_loss hangs on the autograd graph, which neither deepcopy nor pickle can copy.
        state = super().__getstate__()
        return {**state, "aux_loss": None}

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.reshape(-1, self.dim)
        # Routing in full precision under autocast: a bf16 router flips the top-k choice of
        # near-tied tokens, which changes the output discretely (tests/test_precision.py).
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            logits = F.linear(tokens.to(self.router.weight.dtype), self.router.weight, self.router.bias)
            top_experts, chosen = choose(logits, self.active, bias=self.selection_bias, **self.routing)  # (T, active)
        self.aux_loss = self._load_balancing_loss(logits, top_experts)
        inputs = tokens if self.latent_down is None else self.latent_down(tokens)
        # under vmap (stacked grid training) dense: gathering reads each member's counts on the host
        if self.dense_dispatch or self.needs_dense or member_fold.active():
            weights = route(logits, self.active, self.leaky_routing, bias=self.selection_bias, **self.routing)
            out = self._dense(inputs, weights)
        else:
            out = self._gather(inputs, top_experts, chosen)
        if self.latent_up is not None:
            out = self.latent_up(out)
        if self.shared is not None:
            shared = self.shared(tokens)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(tokens)) * shared)
        return out.view_as(x)

    def _load_balancing_loss(self, logits: Tensor, top_experts: Tensor) -> Tensor:
        probs = logits.float().softmax(dim=-1).mean(dim=0)  # P_e
        flat = top_experts.flatten()  # index_add_, not bincount: no host sync per step
        counts = torch.zeros(self.experts, dtype=torch.long, device=flat.device).index_add(
            0, flat, torch.ones_like(flat)
        )  # out of place: vmap cannot add members' counts into one tensor
        fractions = counts.to(probs.dtype) / top_experts.numel()  # f_e (no gradient: counts)
        return self.aux_loss_weight * self.experts * (fractions * probs).sum()

    def _dense(self, tokens: Tensor, weights: Tensor) -> Tensor:
        """Every expert on every token (rows of the experts' width), weighted by `weights` (T, experts)."""
        n_tokens, dim = tokens.shape
        width = self.experts * self.expert_width
        # (experts, dim, width) -> (dim, experts * width): all experts side by side.
        inputs = (self.w_up,) if self.w_gate is None else (self.w_gate, self.w_up)
        gate_up = torch.cat(inputs, dim=0).permute(1, 0, 2).reshape(dim, len(inputs) * width)
        hidden = self._hidden(*(tokens @ gate_up).split(width, dim=-1))  # (T, width)
        if self.dense_down:  # each expert's down projection reads all hidden units
            down = self.w_down.permute(1, 0, 2).reshape(width, self.experts * dim)
            outputs = (hidden @ down).view(n_tokens, self.experts, dim)
            return (outputs * weights.unsqueeze(-1).to(outputs.dtype)).sum(1)
        hidden = (hidden.view(n_tokens, self.experts, self.expert_width) * weights.unsqueeze(-1)).view(n_tokens, width)
        return hidden @ self.w_down.reshape(width, dim)

    def _hidden(self, *projected: Tensor) -> Tensor:
        """An expert's hidden units from its gate and up projections (GLU), or its up projection alone."""
        if len(projected) == 1:
            return self.activation(projected[0])
        gate, up = projected
        return self.activation(gate) * up

    def _gather(self, tokens: Tensor, top_experts: Tensor, top_weights: Tensor) -> Tensor:
        flat_experts = top_experts.flatten()  # routing slots, token-major
        order = torch.argsort(flat_experts, stable=True)
        slot_tokens = order // self.active  # the token of each sorted slot
        counts = torch.bincount(flat_experts, minlength=self.experts).tolist()
        sorted_inputs = tokens[slot_tokens]
        sorted_weights = top_weights.flatten()[order].unsqueeze(-1)
        outputs = []
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            chunk = sorted_inputs[start : start + count]
            hidden = self._hidden(*((chunk @ w[expert]) for w in (self.w_gate, self.w_up) if w is not None))
            outputs.append(hidden @ self.w_down[expert])
            start += count
        expert_out = torch.cat(outputs) * sorted_weights
        return torch.zeros_like(tokens).index_add(0, slot_tokens, expert_out)
