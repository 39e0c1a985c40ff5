"""Zamba2's shared transformer block, one use of it (`Zs`): the torch module of `madsl.primitives.zamba`.

    x    = input_norm(cat(h, e))                         RMSNorm over 2D; e: the model's token embeddings
    q, k, v = q_proj x + qA(x), k_proj x + kA(x), v_proj x + vA(x)     adapters only with qkv_adapters
    q, k = rotary(q), rotary(k)                          optional (rope); rotate-half over the whole head
    a    = o_proj(softmax(q k^T (head_dim / 2)^-0.5 + causal mask) v)
    g, u = chunk(gate_up(y) + gate_upA(y), 2),  y = pre_ff_norm(a)
    z    = out(down(act(g) * u))                         out: the use's own Linear(D, D)

One module per use: `shared` (ZambaCore: the norms, q/k/v/o, gate_up and down) is the block every use
runs, the rest (`out`, `gate_up_adapter` and the q/k/v adapters) this use's own. `another_use()` gives
a further use: the same `shared` module object, fresh per-use parts; the compiler calls it for the
second and later uses of a tag, so a model holds the core once.

The token embeddings come through an `EmbeddingLink` the model sets before each call (`embeddings`:
(B, L, D) in forward and prefill, (B, D) in step); a layer without one raises RuntimeError.
Grouped-query attention repeats each key/value head for its heads / kv_heads query heads (transformers'
repeat_kv). Step mode keeps attention's KV cache: {"k": (B, kv_heads, T, head_dim), "v": the same,
"pos": (B,) int64, the next token's position}; keys are cached rotated.

Init: PyTorch's default Linear init (kaiming-uniform, bound 1/sqrt(fan_in)) for every weight, the
adapters' too (a zero adapter would leave its gradient to the other factor alone), biases zero, norm
weights one: as madsl's attention and MLP modules. `another_use` initialises its parts the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.attention import scaled_dot_product_attention
from madsl.layers.rotary import rotate
from madsl.primitives.zamba import ZambaShared as ZambaSharedPrimitive


class EmbeddingLink:
    """The model's token embeddings for the current call ((B, L, D) in forward and prefill, (B, D) in
    step), set by the model before its layers run; a Zs layer reads them."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Tensor | None = None


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": _gelu_tanh, "silu": F.silu}


def _adapter(width_in: int, rank: int, width_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width_in, rank, bias=False), nn.Linear(rank, width_out, bias=False))


def _repeat_heads(x: Tensor, groups: int) -> Tensor:
    """(B, kv_heads, T, hd) -> (B, heads, T, hd), each key/value head for its consecutive query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class ZambaCore(nn.Module):
    """The shared block's parameters: one object, held by every use of the block."""

    def __init__(self, p: ZambaSharedPrimitive):
        super().__init__()
        dim = p.dim
        self.input_norm = nn.RMSNorm(2 * dim, eps=p.norm_eps)
        self.q_proj = nn.Linear(2 * dim, p.inner, bias=False)
        self.k_proj = nn.Linear(2 * dim, p.kv_inner, bias=False)
        self.v_proj = nn.Linear(2 * dim, p.kv_inner, bias=False)
        self.o_proj = nn.Linear(p.inner, dim, bias=False)
        self.pre_ff_norm = nn.RMSNorm(dim, eps=p.norm_eps)
        self.gate_up = nn.Linear(dim, 2 * p.ffn, bias=p.bias)
        self.down = nn.Linear(p.ffn, dim, bias=p.bias)
        for linear in (self.gate_up, self.down):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)


class ZambaShared(nn.Module):
    stacks = True  # exact under vmap over stacked members: plain ops, SDPA folds

    def __init__(self, p: ZambaSharedPrimitive):
        super().__init__()
        self._setup(p, ZambaCore(p))

    def _setup(self, p: ZambaSharedPrimitive, shared: ZambaCore) -> None:
        self.primitive = p  # what another_use builds its parts from
        dim, rank = p.dim, p.adapter_rank
        self.heads, self.kv_heads, self.groups = p.heads, p.key_value_heads, p.groups
        self.head_dim, self.scale = p.inner_head_dim, p.scale
        self.rope, self.rope_theta = p.rope, float(p.rope_theta)
        self.act = ACTIVATIONS[p.activation]
        self.shared = shared
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate_up_adapter = _adapter(dim, rank, 2 * p.ffn)
        if p.qkv_adapters:
            self.q_adapter = _adapter(2 * dim, rank, p.inner)
            self.k_adapter = _adapter(2 * dim, rank, p.kv_inner)
            self.v_adapter = _adapter(2 * dim, rank, p.kv_inner)
        else:
            self.q_adapter = self.k_adapter = self.v_adapter = None
        # set by the model (the compiler wires it): where this layer reads the token embeddings
        self.embeddings: EmbeddingLink | None = None

    def another_use(self) -> "ZambaShared":
        """A further use of this block: the same `shared` core (one module object), per-use parts of its
        own, initialised as the first use's."""
        other = type(self).__new__(type(self))
        nn.Module.__init__(other)
        other._setup(self.primitive, self.shared)
        return other

    # ---- the block ------------------------------------------------------------------------------
    def _embeddings(self, like: Tensor) -> Tensor:
        link = self.embeddings
        if link is None or link.value is None:
            raise RuntimeError(
                "Zs reads the model's token embeddings: build it inside a model (the compiler links them), "
                "or give the layer an EmbeddingLink (layer.embeddings) holding them before each call"
            )
        if link.value.shape != like.shape:
            raise RuntimeError(
                f"Zs reads the model's token embeddings as wide as its input: got {tuple(link.value.shape)} "
                f"for an input of {tuple(like.shape)}"
            )
        return link.value

    def _qkv(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (.., heads, hd), k and v (.., kv_heads, hd) from h (.., D) and the linked embeddings."""
        core = self.shared
        x = core.input_norm(torch.cat((h, self._embeddings(h)), dim=-1))
        q, k, v = core.q_proj(x), core.k_proj(x), core.v_proj(x)
        if self.q_adapter is not None:
            q, k, v = q + self.q_adapter(x), k + self.k_adapter(x), v + self.v_adapter(x)
        lead = h.shape[:-1]
        return q.view(*lead, self.heads, self.head_dim), *(t.view(*lead, self.kv_heads, self.head_dim) for t in (k, v))

    def _after_attention(self, a: Tensor) -> Tensor:
        """z from the heads' outputs a (.., heads x hd): o_proj, the MLP and this use's projection."""
        core = self.shared
        y = core.pre_ff_norm(core.o_proj(a))
        gate, up = (core.gate_up(y) + self.gate_up_adapter(y)).chunk(2, dim=-1)
        return self.out(core.down(self.act(gate) * up))

    # ---- parallel (training) form ---------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        return self.prefill(x)[0]

    def prefill(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The parallel forward and the KV cache `step` continues from."""
        batch, length, _ = x.shape
        q, k, v = self._qkv(x)  # (B, L, heads or kv_heads, hd)
        if self.rope:
            positions = torch.arange(length, device=x.device)
            q, k = rotate(q, positions, self.rope_theta), rotate(k, positions, self.rope_theta)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads or kv_heads, L, hd)
        y = scaled_dot_product_attention(
            q, _repeat_heads(k, self.groups), _repeat_heads(v, self.groups), is_causal=True, scale=self.scale
        )
        z = self._after_attention(y.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))
        return z, {"k": k, "v": v, "pos": torch.full((batch,), length, dtype=torch.long, device=x.device)}

    # ---- recurrent (inference) form -------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out.weight
        device = device if device is not None else weight.device
        dtype = dtype if dtype is not None else weight.dtype
        empty = torch.zeros(batch, self.kv_heads, 0, self.head_dim, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "pos": torch.zeros(batch, dtype=torch.long, device=device)}

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        batch = x_t.shape[0]
        q, k, v = (t.unsqueeze(1) for t in self._qkv(x_t))  # (B, 1, heads or kv_heads, hd)
        pos = state["pos"]
        if self.rope:
            q, k = rotate(q, pos[:, None], self.rope_theta), rotate(k, pos[:, None], self.rope_theta)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads or kv_heads, 1, hd)
        keys = torch.cat((state["k"], k), dim=2)
        values = torch.cat((state["v"], v), dim=2)
        # the new token attends to every cached one: no mask
        y = F.scaled_dot_product_attention(
            q, _repeat_heads(keys, self.groups), _repeat_heads(values, self.groups), scale=self.scale
        )
        z = self._after_attention(y.reshape(batch, self.heads * self.head_dim))
        return z, {"k": keys, "v": values, "pos": pos + 1}
