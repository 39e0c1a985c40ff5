"""Hymba (`model_type: hymba`, NVIDIA's Hymba-1.5B; its own HymbaForCausalLM, remote code on the Hugging Face
hub: transformers has no class) config.json -> madsl spec.

Every one of num_hidden_layers layers is a pre-norm residual hybrid-head mixer (`Hb`, madsl/primitives/hymba.py:
attention heads and Mamba-1 heads side by side on one input projection, their outputs normed, averaged and
projected by one out_proj) and a pre-norm residual SwiGLU of intermediate_size (`Sg`; HymbaDecoderLayer builds
one expert whatever num_experts says). num_memory_tokens learned meta tokens are prepended to every sequence
(the spec's `meta_tokens`); the layers of global_attn_idx attend to every earlier position, the others within
sliding_window (HymbaFlexAttention's mask q - k <= sliding_window: a window of sliding_window + 1 positions)
and to the meta tokens always (`sinks`). The layers kv_reuse_group lists after a group's first (or every
layer off a multiple of kv_reuse_every_i_layer) compute no keys and values of their own: they read their
group's first layer's (`kv_reuse`), which madsl links to the nearest earlier layer that computes its own, so
a group whose first layer is not that one is refused. Rotary on q and k (`rope`), at rope_theta or, with
rope_type "ntk", at HymbaRotaryEmbedding's NTK base theta * (2 max_position_embeddings /
orig_max_position_embeddings - 1) ^ (head_dim / (head_dim - 2)). Every norm is an RMSNorm at rms_norm_eps;
embeddings tied unless tie_word_embeddings is false.

Every key is read as HymbaConfig (configuration_hymba.py) reads it, with its defaults listed. Refused by name:
the options the released model does not use and madsl's Hb does not state (kq_norm, attn_hidden_size and
kq_head_dim other than the hidden size's, memory_tokens_interspersed_every, num_mamba other than 1,
kv_weight_reuse, mamba_proj_bias, mamba_conv_bias false, mamba_inner_layernorms false, rope_type
dynamic_ntk, activations other than silu). Not written back: `--to-hf` has no class to load a Hymba config.
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.interop.huggingface.base import Family, ignored, spec_data
from madsl.interop.huggingface.config import Config
from madsl.lang.spec.keys import MAX_META_TOKENS

NTK_FACTOR = 2  # HymbaRotaryEmbedding's factor, fixed in its code


class Hymba(Family):
    model_type, title, architecture, tied_by_default = "hymba", "Hymba", "HymbaForCausalLM", False
    config_class = "HymbaConfig"
    config_owner = "NVIDIA's"  # remote code on the hub: transformers has no Hymba
    # HymbaConfig's defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "mlp_hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "sliding_window": None,
        "max_position_embeddings": 262144,
        "orig_max_position_embeddings": None,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_inner_layernorms": True,
        "kv_reuse_every_i_layer": -1,
        "kv_reuse_group": None,
        "kv_weight_reuse": False,
        "global_attn_idx": None,
        "num_mamba": 1,
        "rope_type": None,
        "attn_hidden_size": -1,
        "kq_head_dim": -1,
        "kq_norm": None,
        "rope": False,
        "rope_theta": 10000.0,
        "num_memory_tokens": 0,
        "memory_tokens_interspersed_every": 0,
        "tie_word_embeddings": False,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        self._refusals(cfg)
        heads = cfg.count("num_attention_heads")
        kv_heads = cfg.count("num_key_value_heads")
        expand = cfg.count("mamba_expand")
        for key, value, rest, what in (
            ("num_attention_heads", heads, dim % heads, f"hidden_size={dim}"),
            ("num_key_value_heads", kv_heads, heads % kv_heads, f"num_attention_heads={heads}"),
            ("num_attention_heads", heads, (expand * dim) % heads, f"the Mamba width {expand * dim}"),
        ):
            if rest:
                default = " (HymbaConfig's default)" if key not in cfg.data else ""
                raise cfg.error(key, f"{value}{default} does not divide {what}")
        head_dim = dim // heads
        window = cfg.data.get("sliding_window", cfg.defaults["sliding_window"])
        window = None if window is None else cfg.count("sliding_window") + 1  # q - k <= sliding_window
        bound = f"madsl's meta_tokens go up to {MAX_META_TOKENS:,}"
        meta = cfg.count("num_memory_tokens", 0, MAX_META_TOKENS, hint=bound)
        hb = {
            "heads": heads,
            "kv_heads": kv_heads,
            "expand": expand,
            "d_state": cfg.count("mamba_d_state"),
            "d_conv": cfg.count("mamba_d_conv"),
            "dt_rank": self._dt_rank(cfg, dim),
            "rotary": cfg.flag("rope"),
            "rope_theta": self._theta(cfg, head_dim) if cfg.flag("rope") else 10000.0,
            "norm_eps": cfg.number("rms_norm_eps", positive=True),
            "window": window,
            "sinks": meta if window is not None else 0,
        }
        globals_, consumers = self._global(cfg, n, window), self._consumers(cfg, n)
        blocks = [f"{'HbR' if i in consumers else 'HbG' if i in globals_ else 'Hb'}-Sg" for i in range(n)]
        ignored(cfg, "num_experts", 1, "builds one expert in every layer (num_experts=1 in HymbaDecoderLayer)")
        ignored(cfg, "v_head_dim", expand * dim // heads, "sets it to mamba_expand x hidden_size / heads (HymbaBlock)")
        self._layer_widths(cfg, n, expand * dim)
        layers = {
            "Hb": hb,
            "HbG": {"base": "Hb", "window": None, "sinks": 0},  # global attention
            "HbR": {"base": "Hb", "kv_reuse": True},  # reads its group's first layer's keys and values
            "Sg": {"inner": cfg.count("intermediate_size")},
        }
        if window is None:
            blocks = [block.replace("HbG", "Hb") for block in blocks]
        data = spec_data(cfg, name, self, dim, blocks, layers)
        if not any(block.startswith("Hb-") for block in blocks):  # the variants name Hb as their base
            data["layers"]["Hb"] = hb
        return {**data, "norm_eps": hb["norm_eps"], "meta_tokens": meta}

    def _refusals(self, cfg: Config) -> None:
        unused = {
            "kq_norm": (None, "none"),
            "memory_tokens_interspersed_every": (0,),
            "num_mamba": (1,),
            "kv_weight_reuse": (False,),
            "mamba_proj_bias": (False,),
            "mamba_conv_bias": (True,),
            "mamba_inner_layernorms": (True,),
            "hidden_act": ("silu",),
            "mlp_hidden_act": ("silu",),
        }
        for key, allowed in unused.items():
            value = cfg.data.get(key, cfg.defaults[key])
            if value not in allowed:
                raise cfg.error(
                    key,
                    f"{value!r}: the released Hymba uses {allowed[-1]!r}, and madsl's Hb states no other",
                    f"{key}: {str(allowed[-1]).lower() if isinstance(allowed[-1], bool) else allowed[-1]}",
                )
        dim = cfg.count("hidden_size")
        for key in ("attn_hidden_size", "kq_head_dim"):
            value = cfg.data.get(key, -1)
            wanted = dim if key == "attn_hidden_size" else dim // cfg.count("num_attention_heads")
            if value not in (-1, wanted):
                raise cfg.error(key, f"{value!r}: madsl's Hb attends over the hidden size ({wanted})", f"{key}: -1")
        if cfg.data.get("rope_type") == "dynamic_ntk":
            raise cfg.error("rope_type", '"dynamic_ntk" rescales rotary by the length: madsl\'s rotary has one base')

    def _layer_widths(self, cfg: Config, n: int, width: int) -> None:
        """Every layer a hybrid one ("h") with Mamba heads expand x hidden_size wide, where the config says."""
        kinds = cfg.data.get("layer_type")
        if kinds is not None and kinds != ["h"] * n:
            raise cfg.error("layer_type", 'madsl reads Hymba\'s hybrid layers alone ("h", one a layer)')
        widths = cfg.data.get("conv_dim")
        if widths is not None and (not isinstance(widths, dict) or set(widths.values()) != {width}):
            raise cfg.error("conv_dim", f"every layer's Mamba heads are {width} wide (mamba_expand x hidden_size)")

    def _dt_rank(self, cfg: Config, dim: int) -> int:
        if cfg.data.get("mamba_dt_rank", "auto") == "auto":
            return cfg.take_default("mamba_dt_rank", -(-dim // 16), '"auto": ceil(hidden_size / 16), as HymbaConfig')
        return cfg.count("mamba_dt_rank")

    def _theta(self, cfg: Config, head_dim: int) -> float:
        theta = cfg.number("rope_theta", positive=True)
        kind = cfg.data.get("rope_type", cfg.defaults["rope_type"])
        if kind in (None, "default"):
            return theta
        if kind != "ntk":
            raise cfg.error("rope_type", f"{kind!r}: madsl reads Hymba's default and ntk rotary", "rope_type: ntk")
        longest, original = cfg.count("max_position_embeddings"), cfg.count("orig_max_position_embeddings")
        return theta * (NTK_FACTOR * longest / original - (NTK_FACTOR - 1)) ** (head_dim / (head_dim - 2))

    def _global(self, cfg: Config, n: int, window: int | None) -> set[int]:
        if window is None:
            return set(range(n))
        if cfg.data.get("global_attn_idx") is None:
            cfg.take_default("global_attn_idx", None, "null: every layer within the sliding window")
            return set()
        return set(cfg.integers("global_attn_idx", n))

    def _consumers(self, cfg: Config, n: int) -> set[int]:
        """The layers that read another's keys and values, checked to read the nearest producer before them."""
        every = cfg.data.get("kv_reuse_every_i_layer", -1)
        groups = cfg.data.get("kv_reuse_group")
        if groups is not None:
            groups = self._groups(cfg, n)
            consumers = {i for group in groups for i in group[1:]}
            for group in groups:
                for i in group[1:]:
                    nearest = max(j for j in range(i) if j not in consumers) if i else None
                    if nearest != group[0]:
                        raise cfg.error(
                            "kv_reuse_group",
                            f"layer {i} reads layer {group[0]}'s keys and values, but the nearest layer before it "
                            f"that computes its own is {nearest}: madsl links a layer to that one",
                            "groups of consecutive layers, each led by the layer that computes",
                        )
            return consumers
        if isinstance(every, int) and every > 0:
            return {i for i in range(n) if i % every}
        return set()

    def _groups(self, cfg: Config, n: int) -> list[list[int]]:
        groups = cfg.data["kv_reuse_group"]
        ok = isinstance(groups, list) and all(
            isinstance(g, list) and len(g) >= 2 and all(type(i) is int and 0 <= i < n for i in g) for g in groups
        )
        if not ok:
            raise cfg.error("kv_reuse_group", "expected lists of layer indices, each a producer and its consumers")
        return groups

    def write(self, spec: Any) -> dict[str, Any]:
        raise MadslError(
            f"{spec.name}: madsl writes no Hymba config.json: Hymba's class is NVIDIA's remote code, which "
            "transformers does not load without it, and whose forward runs only on CUDA kernels",
            hint="convert from a Hymba config.json; export to a family transformers builds",
        )
