"""RWKV-7 "Goose" (`model_type: rwkv7`: flash-linear-attention's RWKV7ForCausalLM, fla-hub's RWKV-7 models)
config.json <-> madsl spec.

Every one of num_hidden_layers blocks is a pre-norm residual RWKV-7 time mixer and a pre-norm residual
RWKV-7 channel mixer, LayerNorms with biases throughout at norm_eps, a final norm, untied embeddings
unless tie_word_embeddings: `R7-R6c:(N-1)R7{value_residual=true}-R6c`. The first time mixer is `R7` (fla's
RWKV7Attention with layer_idx 0); every later one mixes its values toward the first's (value_residual,
v_lora of rank v_low_rank_dim), a link the compiler makes. The time mixers have head_dim-wide heads
(num_heads = hidden_size / head_dim; fla's layer reads head_dim over num_heads) and LoRA ranks
decay_low_rank_dim, a_low_rank_dim, gate_low_rank_dim (null: fla's rule from hidden_size and head_dim).
fuse_norm (fla's default true) computes kk's l2 norm as k / sqrt(|k|^2 + 1e-6) (`l2norm_eps: 1e-6`;
false: F.normalize, 0); its fused LayerNorm and GroupNorm compute what torch's do. The channel mixer
(`R6c` with `receptance: false`, fla's RWKV7FeedForward) is intermediate_size wide, or hidden_ratio x
hidden_size rounded up to a multiple of 32.

norm_first (fla's default true) puts a LayerNorm (layer 0's pre_norm) on the embeddings before the first
block: the spec's `embedding_norm: true` (tied embeddings then feed the head the raw table, as fla's do).
Refused by name: attn (softmax
attention layers among the RWKV-7 ones), value_dim wider than hidden_size, hidden_act other than
sqrelu, norm_bias false (madsl's LayerNorm has a bias), norm_eps other than 1e-5 (madsl's R7 normalises
its heads at head_dim x 1e-5). attn_mode, the loss keys (fuse_cross_entropy, use_l2warp, ...) and
initializer_range carry no parameter, state or FLOP and are not read. Written back with norm_first as
the spec's embedding_norm and fuse_norm as the R7 layers' l2norm_eps says.
"""

from __future__ import annotations

import math
from typing import Any

from madsl.interop.huggingface.base import Family, Stack, spec_data
from madsl.interop.huggingface.config import Config
from madsl.interop.huggingface.shown import shown_value

GROUP_NORM_EPS = 1e-5  # madsl's R7 normalises its heads at head_dim x this, as fla's layer at norm_eps 1e-5
FUSED_L2NORM_EPS = 1e-6  # fla's l2_norm (fuse_norm true)
RANK_KEYS = {"decay_rank": "decay_low_rank_dim", "a_rank": "a_low_rank_dim", "gate_rank": "gate_low_rank_dim"}


def fla_rank(key: str, dim: int, head_dim: int) -> int:
    """fla's RWKV7Attention rule for a LoRA rank its config leaves null."""
    factor = {"decay_low_rank_dim": 2.5, "a_low_rank_dim": 2.5, "gate_low_rank_dim": 5.0, "v_low_rank_dim": 1.7}[key]
    scale = 1.0 if key == "gate_low_rank_dim" else head_dim / 64
    return max(32, int(round(factor * dim**0.5 * scale / 32) * 32))


class RWKV7(Family):
    model_type, title, architecture, tied_by_default = "rwkv7", "RWKV-7", "RWKV7ForCausalLM", False
    config_class = "RWKV7Config"
    config_owner = "flash-linear-attention's"  # transformers has no RWKV-7
    # fla's RWKV7Config defaults, taken where a config leaves a key out
    defaults = {
        "head_dim": 64,
        "num_heads": None,
        "decay_low_rank_dim": 64,
        "gate_low_rank_dim": 128,
        "a_low_rank_dim": 64,
        "v_low_rank_dim": 16,
        "hidden_ratio": 4,
        "intermediate_size": None,
        "hidden_act": "sqrelu",
        "norm_first": True,
        "norm_bias": True,
        "norm_eps": 1e-5,
        "fuse_norm": True,
        "attn": None,
        "value_dim": None,
        "tie_word_embeddings": False,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        self._refusals(cfg, dim)
        head_dim = self._head_dim(cfg, dim)
        ranks = {field: self._rank(cfg, key, dim, head_dim) for field, key in RANK_KEYS.items()}
        first = {"heads": dim // head_dim, **ranks, "l2norm_eps": FUSED_L2NORM_EPS if cfg.flag("fuse_norm") else 0.0}
        blocks = ["R7-R6c"] + ["R7{value_residual=true}-R6c"] * (n - 1)
        if n > 1:
            first["value_rank"] = self._rank(cfg, "v_low_rank_dim", dim, head_dim)
        layers = {"R7": first, "R6c": {"inner": self._inner(cfg, dim), "receptance": False}}
        tied = cfg.flag("tie_word_embeddings")
        data = spec_data(cfg, name, self, dim, blocks, layers, tied=tied)
        embedding_norm = {"embedding_norm": True} if cfg.flag("norm_first") else {}  # layer 0's pre_norm
        return {**data, "norm": "layer", "norm_eps": GROUP_NORM_EPS, **embedding_norm}

    @staticmethod
    def _refusals(cfg: Config, dim: int) -> None:
        if cfg.data.get("attn") is not None:
            raise cfg.error(
                "attn",
                "sets softmax attention layers among the RWKV-7 ones, which madsl does not convert",
                "attn: null",
            )
        value_dim = cfg.data.get("value_dim")
        if value_dim is not None and any(v != dim for v in (value_dim if isinstance(value_dim, list) else [value_dim])):
            raise cfg.error(
                "value_dim",
                f"{shown_value(value_dim)}: madsl's R7 has values as wide as hidden_size ({dim})",
                "value_dim: null",
            )
        cfg.word("hidden_act", ("sqrelu",))  # the channel mixer's relu(x)^2
        if not cfg.flag("norm_bias"):
            raise cfg.error("norm_bias", "is false: madsl's LayerNorms have a bias", "norm_bias: true")
        if cfg.number("norm_eps", positive=True) != GROUP_NORM_EPS:
            raise cfg.error(
                "norm_eps",
                f"is {shown_value(cfg.data['norm_eps'])}: madsl's R7 normalises its heads at head_dim x 1e-5",
                "norm_eps: 1e-5",
            )

    @staticmethod
    def _head_dim(cfg: Config, dim: int) -> int:
        """fla's RWKV7Attention reads head_dim over num_heads; num_heads alone gives hidden_size / num_heads."""
        if cfg.data.get("head_dim", 64) is None:
            heads = cfg.count("num_heads", hint="head_dim or num_heads")
            if dim % heads:
                raise cfg.error("num_heads", f"{heads} does not divide hidden_size={dim}")
            return dim // heads
        head_dim = cfg.count("head_dim")
        if dim % head_dim:
            raise cfg.error("head_dim", f"{head_dim} does not divide hidden_size={dim}")
        heads = cfg.data.get("num_heads")
        if heads is not None and heads != dim // head_dim:
            cfg.notes.append(f"num_heads = {shown_value(heads)} is not read: fla's RWKV7Attention reads head_dim")
        return head_dim

    @staticmethod
    def _rank(cfg: Config, key: str, dim: int, head_dim: int) -> int:
        if key in cfg.data and cfg.data[key] is None:
            return fla_rank(key, dim, head_dim)
        return cfg.count(key)

    @staticmethod
    def _inner(cfg: Config, dim: int) -> int:
        """RWKV7FeedForward's width: intermediate_size, or hidden_ratio x hidden_size rounded up to 32."""
        if cfg.data.get("intermediate_size") is not None:
            return cfg.count("intermediate_size")
        if "intermediate_size" not in cfg.data:
            cfg.take_default("intermediate_size", None)
        ratio = 4 if cfg.data.get("hidden_ratio", 4) is None else cfg.number("hidden_ratio", positive=True)
        return 32 * math.ceil(int(dim * ratio) / 32)

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self, norm="layer", varying=frozenset({"value_residual"}))
        stack.refuse_kinds({"rwkv7", "rwkv_channel"}, "R7, then R6c with receptance: false, in every block")
        mixers = [m for m, _ in stack.layers]
        if any(m.name != "rwkv7" or c is None or c.name != "rwkv_channel" for m, c in stack.layers):
            stack.refuse("every RWKV-7 block is R7, then its channel mixer R6c", "R7-R6c")
        if [m.value_residual for m in mixers] != [False] + [True] * (len(mixers) - 1):
            stack.refuse(
                "RWKV-7's first time mixer is a first layer and every later one mixes in its values",
                "R7 first, then R7{value_residual=true}",
            )
        r7, channel = stack.kinds["rwkv7"], stack.kinds["rwkv_channel"]
        if channel.receptance:
            stack.refuse("RWKV-7's channel mixer has no receptance gate", "R6c receptance: false")
        if spec.norm_eps != GROUP_NORM_EPS or r7.l2norm_eps not in (0.0, FUSED_L2NORM_EPS):
            stack.refuse(
                "RWKV-7's norms share norm_eps with its heads' (1e-5 in madsl), and its kk norm is fla's "
                "fused l2_norm (eps 1e-6) or F.normalize (0)",
                "norm_eps: 1e-5, R7 l2norm_eps: 1e-6 or 0",
            )
        out = stack.common(self.model_type)
        out.update(
            {
                "head_dim": r7.head_dim,
                "num_heads": r7.heads,
                "decay_low_rank_dim": r7.decay_rank,
                "a_low_rank_dim": r7.a_rank,
                "gate_low_rank_dim": r7.gate_rank,
                "v_low_rank_dim": r7.value_rank,
                "intermediate_size": channel.inner,
                "hidden_act": "sqrelu",
                "norm_first": spec.embedding_norm,  # layer 0's pre_norm
                "norm_bias": True,
                "norm_eps": spec.norm_eps,
                "fuse_norm": r7.l2norm_eps == FUSED_L2NORM_EPS,
                "attn": None,
                "value_dim": [spec.dim] * len(mixers),
            }
        )
        return out
