"""Mamba (`model_type: mamba`: state-spaces/mamba-130m-hf and its sizes; transformers'
MambaForCausalLM) config.json <-> madsl spec.

Every one of num_hidden_layers blocks is a pre-norm residual Mamba-1 mixer (`Mb`, which mixes
channels itself: no MLP), RMSNorms at layer_norm_epsilon, a final norm, embeddings tied unless
tie_word_embeddings says not. The mixer is expand x hidden_size wide with state_size states, a conv
of conv_kernel, time_step_rank ("auto": ceil(hidden_size / 16)), biases by use_bias and
use_conv_bias. The dt initialisation keys, residual_in_fp32 (the residual's precision) and the
kernel switches carry no parameter, state or FLOP and are not read.
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, spec_data
from madsl.interop.huggingface.config import Config


class Mamba(Family):
    model_type, title, architecture, tied_by_default = "mamba", "Mamba", "MambaForCausalLM", True
    config_class = "MambaConfig"
    # transformers' MambaConfig defaults, taken where a config leaves a key out
    defaults = {
        "state_size": 16,
        "expand": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": "auto",
        "layer_norm_epsilon": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        cfg.word("hidden_act", ("silu",))  # MambaMixer gates and convolves with it; madsl's Mb with SiLU
        if "time_step_rank" not in cfg.data:
            cfg.take_default("time_step_rank", "auto")
        rank = (
            -(-dim // 16)  # ceil(hidden_size / 16)
            if cfg.data.get("time_step_rank", "auto") == "auto"
            else cfg.count("time_step_rank", hint='a positive integer, or "auto" (hidden_size / 16)')
        )
        layers = {
            "Mb": {
                "d_state": cfg.count("state_size"),
                "d_conv": cfg.count("conv_kernel"),
                "expand": cfg.count("expand"),
                "dt_rank": rank,
                "bias": cfg.flag("use_bias"),
                "conv_bias": cfg.flag("use_conv_bias"),
            }
        }
        data = spec_data(cfg, name, self, dim, ["Mb"] * n, layers)
        return {**data, "norm_eps": cfg.number("layer_norm_epsilon", positive=True)}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"mamba"}, "Mamba-1 (Mb) in every block, with no channel mixer")
        if any(channel is not None for _, channel in stack.layers):
            stack.refuse("Mamba's blocks have no MLP", "Mb-none, or channel_mixer: none")
        m = stack.kinds["mamba"]
        if m.inner_norms:
            stack.refuse("Mamba's mixer does not normalise dt, B and C (Jamba's does)", "Mb inner_norms: false")
        out = stack.common(self.model_type)
        out.update(
            {
                "state_size": m.d_state,
                "expand": m.expand,
                "conv_kernel": m.d_conv,
                "time_step_rank": m.rank,
                "use_bias": m.bias,
                "use_conv_bias": m.conv_bias,
                "layer_norm_epsilon": spec.norm_eps,
                "hidden_act": "silu",
            }
        )
        return out
