"""xLSTM (NX-AI, `model_type: xlstm`: xLSTM-7B; transformers' xLSTMForCausalLM) config.json <-> madsl spec.

Every one of num_hidden_layers blocks is a pre-norm residual mLSTM layer
and a pre-norm residual SwiGLU, RMSNorms throughout, a final norm (add_out_norm), untied
embeddings: `(mL-Sg)xN`. The mLSTM layer (madsl's `mL` with xLSTM-7B's options) has num_heads
heads; its values are v_dim_factor x hidden_size wide, its queries and keys qk_dim_factor x
hidden_size;
its gates are soft-capped at gate_soft_cap; its per-head norm has norm_eps and its kernels' eps
and zero initial stabiliser. use_bias (false in xLSTM-7B) would give the block norms biases too,
which madsl's RMSNorm has not: refused by name.
The SwiGLU is round_up(ffn_proj_factor x hidden_size, ffn_round_up_to_multiple_of) wide.
The block norms and the final one have norm_eps too (the spec's norm_eps), and the logits go
through output_logit_soft_cap (the spec's logit_soft_cap). Kernel, mode and dtype keys carry no
parameter, state or FLOP and are not read. weight_mode "fused" stores q, k, v and the gates as one
matrix: the same parameters.
"""

from __future__ import annotations

import math
from typing import Any

from madsl.interop.huggingface.base import Family, Stack, spec_data
from madsl.interop.huggingface.config import Config


class XLSTM(Family):
    model_type, title, architecture, tied_by_default = "xlstm", "xLSTM", "xLSTMForCausalLM", False
    config_class = "xLSTMConfig"
    # transformers' xLSTMConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_heads": 8,
        "use_bias": False,
        "tie_word_embeddings": False,
        "add_out_norm": True,
        "norm_eps": 1e-6,
        "qk_dim_factor": 0.5,
        "v_dim_factor": 1.0,
        "eps": 1e-6,
        "ffn_proj_factor": 2.667,
        "ffn_round_up_to_multiple_of": 64,
        "gate_soft_cap": 15.0,
        "weight_mode": "single",
        "output_logit_soft_cap": 30.0,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        # transformers' xLSTM sizes its embedding by embedding_dim and its stack by num_blocks: each
        # must say what its twin says, or the model it builds is not one stack
        for key, twin, value in (("embedding_dim", "hidden_size", dim), ("num_blocks", "num_hidden_layers", n)):
            if cfg.data.get(key) is not None and cfg.data[key] != value:
                raise cfg.error(
                    key, f"{cfg.data[key]!r} differs from {twin}={value}", f"{key}: {value}, or leave it out"
                )
        heads = cfg.count("num_heads")
        if not cfg.flag("add_out_norm"):
            raise cfg.error("add_out_norm", "is false: madsl's stacks end in a final norm", "add_out_norm: true")
        cfg.word("weight_mode", ("single", "fused"))
        value_width = _width(cfg, "v_dim_factor", dim, heads)
        key_width = _width(cfg, "qk_dim_factor", dim, heads)
        if cfg.flag("use_bias"):  # its block norms then get biases too, which madsl's RMSNorm has not
            raise cfg.error(
                "use_bias",
                "is true: xLSTM's block norms then have biases, madsl's RMSNorms have none",
                "use_bias: false",
            )
        mlstm = {
            "heads": heads,
            "head_dim": value_width // heads,
            "qk_head_dim": key_width // heads,
            "gate_soft_cap": cfg.number("gate_soft_cap", positive=True),
            "bias": False,
            "norm_eps": cfg.number("norm_eps", positive=True),
            "zero_stabilizer": True,
            "eps": cfg.number("eps", positive=True),
        }
        factor, multiple = cfg.number("ffn_proj_factor", positive=True), cfg.count("ffn_round_up_to_multiple_of")
        inner = multiple * math.ceil(factor * dim / multiple)
        layers = {"mL": mlstm, "Sg": {"inner": inner}}
        data = spec_data(cfg, name, self, dim, ["mL-Sg"] * n, layers)
        cap = cfg.data.get("output_logit_soft_cap", cfg.defaults["output_logit_soft_cap"])
        if "output_logit_soft_cap" not in cfg.data:
            cfg.take_default("output_logit_soft_cap", cap)
        elif cap is not None:
            cap = cfg.number("output_logit_soft_cap", positive=True)
        return {**data, "norm_eps": mlstm["norm_eps"], "logit_soft_cap": cap}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"mlstm", "swiglu"}, "mL, then Sg, in every block")
        if any(c is None for _, c in stack.layers):
            stack.refuse("every xLSTM block ends in its SwiGLU", "mL-Sg")
        m, mlp = stack.kinds["mlstm"], stack.kinds["swiglu"]
        if not m.zero_stabilizer or m.gate_soft_cap is None or m.bias or mlp.bias:
            stack.refuse(
                "xLSTM's mLSTM starts its stabiliser at 0 and soft-caps its gates, and madsl writes xLSTM "
                "without biases (use_bias: false)",
                "mL zero_stabilizer: true, gate_soft_cap: 15, bias: false; Sg bias: false",
            )
        out = stack.common(self.model_type)
        value = m.heads * m.inner_head_dim
        out.update(
            {
                "num_heads": m.heads,
                "use_bias": False,
                "add_out_norm": True,
                "norm_eps": m.norm_eps,
                "eps": m.eps,
                "gate_soft_cap": m.gate_soft_cap,
                "v_dim_factor": value / spec.dim,
                "qk_dim_factor": m.key_inner / spec.dim,
                # the SwiGLU's width as the config rebuilds it: round_up(factor x dim, 64) with factor inner / dim
                "ffn_proj_factor": mlp.inner / spec.dim,
                "ffn_round_up_to_multiple_of": 64 if mlp.inner % 64 == 0 else 1,
                "weight_mode": "single",
                "output_logit_soft_cap": spec.logit_soft_cap,
            }
        )
        if spec.norm_eps != m.norm_eps:
            stack.refuse("xLSTM's block norms share the mLSTM's norm_eps", f"norm_eps: {m.norm_eps:g}")
        return out


def _width(cfg: Config, key: str, dim: int, heads: int) -> int:
    """factor x hidden_size, a whole number divided by the heads (xLSTM's qk and v widths)."""
    width = cfg.number(key, positive=True) * dim
    if width != int(width) or int(width) % heads:
        raise cfg.error(key, f"gives {width:g} channels, not a whole number divided by num_heads={heads}")
    return int(width)
