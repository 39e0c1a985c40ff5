"""Hugging Face `config.json` of hybrid model families <-> madsl specs (`madsl convert --from-hf/--to-hf`).

Each family writes the layer stack its own way (one module per family, on base.py);
all of them stack pre-norm residual layers, each a sequence mixer (or two side by side) followed
by a channel mixer, which is a madsl block:

    jamba             Jamba (AI21): attention and experts placed by period and offset (jamba.py)
    nemotron_h        Nemotron-H, Nemotron-Nano-v2, NVIDIA-Nemotron-3 (NVIDIA): the Megatron pattern or
                      `layers_block_type`, squared-ReLU MLPs and experts (nemotron.py)
    granitemoehybrid  Granite 4.0 hybrids (IBM): `layer_types` (ibm.py)
    bamba             Bamba (IBM): attention by index, Mamba-2 elsewhere (ibm.py)
    falcon_h1         Falcon-H1 (TII): attention beside Mamba-2 in every layer (falcon_h1.py)
    lfm2              LFM2 (Liquid AI): gated short convolutions and attention (lfm2.py)
    lfm2_moe          LFM2-MoE (Liquid AI): LFM2's layers, dense MLPs first, then mixtures of experts (lfm2.py)
    qwen3_next        Qwen3-Next (Qwen): Gated DeltaNet and gated attention, sparse experts with a gated
                      shared expert (qwen3_next.py)
    qwen3_5_text      Qwen3.5's language model: Qwen3-Next's layers, a SwiGLU after each (qwen3_next.py)
    qwen3_5_moe_text  Qwen3.5 MoE's language model: Qwen3-Next's layers, experts after each (qwen3_next.py)
    qwen3_5(_moe)     Qwen3.5's vision-language configs: the language model of text_config (LANGUAGE_MODELS)
    recurrent_gemma   RecurrentGemma (Google): Griffin's RG-LRU blocks and local attention (recurrent_gemma.py)
    kimi_linear       Kimi Linear (Moonshot AI): Kimi Delta Attention and latent attention (NoPE), dense
                      MLPs first, then experts beside a shared expert (kimi_linear.py)
    minimax           MiniMax-Text-01 (MiniMax): lightning attention and softmax attention, experts
                      after each (minimax.py)
    minimax_m1        MiniMax-M1: MiniMax-Text-01's layers in MiniMax's own keys (`attn_type_list`)
    xlstm             xLSTM-7B (NX-AI): mLSTM layers, a SwiGLU after each (xlstm.py)
    rwkv7             RWKV-7 (flash-linear-attention's RWKV7ForCausalLM): RWKV-7 time mixers, the later ones
                      mixing in the first's values, a channel mixer after each (rwkv7.py)
    zamba2            Zamba2 (Zyphra): Mamba-2 layers, shared transformer blocks injected before some of
                      them, with per-use adapters (zamba2.py)
    hymba             Hymba (NVIDIA, remote code): hybrid-head layers (attention and Mamba heads side by
                      side), meta tokens, keys and values shared across layers (hymba.py; read only)

Reading a config gives a spec with its width, vocabulary, layer stack and every layer's sizes,
so that `madsl compile` and `madsl check` account it (embeddings and an untied head included, as
these models count their parameters) and gate it on a budget. Writing goes the other way, for a
spec whose stack the family can express; where it cannot, the error says why. Families madsl
cannot state exactly (REFUSED) are refused by name with the part it lacks, never approximated.
A key a config leaves out is taken at transformers' default where the family's config class has
one, and listed (`read_hf_config(...).notes`); a size that says which model it is is refused by
name instead. Where transformers' class ignores a key (Nemotron-H's tying), madsl follows the class
and says so in the same notes.
Fields that do not change what madsl accounts (token ids, dropout, initialisation, multipliers,
dtype) are not read; what madsl counts differently is listed in docs/convert.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from madsl.errors import Location, MadslError
from madsl.interop.huggingface.base import Family
from madsl.interop.huggingface.config import Config
from madsl.interop.huggingface.falcon_h1 import FalconH1
from madsl.interop.huggingface.gpt_neo import GPTNeo
from madsl.interop.huggingface.hymba import Hymba
from madsl.interop.huggingface.ibm import Bamba, GraniteHybrid
from madsl.interop.huggingface.jamba import Jamba
from madsl.interop.huggingface.kimi_linear import KimiLinear
from madsl.interop.huggingface.lfm2 import Lfm2, Lfm2Moe
from madsl.interop.huggingface.mamba import Mamba
from madsl.interop.huggingface.minimax import MiniMax, MiniMaxM1
from madsl.interop.huggingface.nemotron import NemotronH
from madsl.interop.huggingface.qwen3_next import Qwen3_5MoeText, Qwen3_5Text, Qwen3Next
from madsl.interop.huggingface.recurrent_gemma import RecurrentGemma
from madsl.interop.huggingface.rwkv7 import RWKV7
from madsl.interop.huggingface.shown import look_alike, shown_value
from madsl.interop.huggingface.xlstm import XLSTM
from madsl.interop.huggingface.zamba2 import Zamba2

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Jamba(),
        NemotronH(),
        GraniteHybrid(),
        Bamba(),
        FalconH1(),
        Lfm2(),
        Lfm2Moe(),
        Qwen3Next(),
        Qwen3_5Text(),
        Qwen3_5MoeText(),
        RecurrentGemma(),
        KimiLinear(),
        MiniMax(),
        MiniMaxM1(),
        XLSTM(),
        Mamba(),
        GPTNeo(),
        RWKV7(),
        Zamba2(),
        Hymba(),
    )
}
Config.family_titles = {name: f.title for name, f in FAMILIES.items()}

# vision-language configs whose language model (text_config) is what AutoModelForCausalLM builds from them
LANGUAGE_MODELS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
# hybrid families madsl does not convert, and the part it lacks for each: refused by name
REFUSED = {
    "zamba": (
        "Zamba",
        "its Mamba layers are Zamba's own multi-head Mamba-1 mixers, and its shared block a separate gate, up "
        "and down MLP without adapters (Zamba2, `zamba2`, converts)",
    ),
}


def family(model_type: str, cfg: Config | None = None) -> Family:
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    message = f"madsl converts no {shown_value(model_type)} configs"
    if model_type in REFUSED:
        title, reason = REFUSED[model_type]
        message = f"madsl does not convert {title} ({shown_value(model_type)}) configs: {reason}"
    expected = "model_type " + ", ".join(FAMILIES)
    if cfg is not None:
        raise MadslError(
            f'"model_type": {message}', cfg.where("model_type"), expected=expected, hint=look_alike(model_type)
        )
    raise MadslError(message, expected=expected)


class HfRead(NamedTuple):
    """A config.json read: the spec's data, each key taken at transformers' default (key -> value),
    and the notes that say so, one a line, with the keys read as transformers' class reads them."""

    data: dict[str, Any]
    defaulted: dict[str, Any]
    notes: list[str]


def read_hf_config(source: str | Path | dict[str, Any], name: str = "converted") -> HfRead:
    """A Hugging Face config.json (a path, or the parsed JSON object) of a hybrid family this module
    knows (FAMILIES), read: the spec data, and what was defaulted or read as the class reads it."""
    cfg = Config.of(source) if isinstance(source, dict) else Config.load(source)
    model_type = cfg.word("model_type")
    text = _language_model(cfg, LANGUAGE_MODELS[model_type]) if model_type in LANGUAGE_MODELS else cfg
    reader = family(LANGUAGE_MODELS.get(model_type, model_type), cfg)
    for config in (cfg, text):
        config.defaults, config.config_class, config.config_owner = (
            reader.defaults,
            reader.config_class,
            reader.config_owner,
        )
    data = reader.read(text, name)
    # keys of the language model's own sections (text_config.rope_parameters) are listed in it
    defaulted = {**cfg.defaulted, **{f"text_config.{k}": v for k, v in text.defaulted.items() if text is not cfg}}
    notes = [f"defaulted: {key} = {_json(value)} ({why})" for key, (value, why) in defaulted.items()]
    said = cfg.notes + (text.notes if text is not cfg else [])
    return HfRead(data, {key: value for key, (value, _) in defaulted.items()}, notes + said)


def _language_model(cfg: Config, model_type: str) -> Config:
    """A vision-language config's text_config, which AutoModelForCausalLM builds alone (its vision
    encoder is not counted, said in the notes): its model_type must be `model_type` where written."""
    text = cfg.section("text_config")
    if text is None:
        raise MadslError(
            'missing key "text_config": a vision-language config states its language model there',
            Location(cfg.path),
            hint=f'e.g. "text_config": {{"model_type": "{model_type}", "hidden_size": ..., ...}}',
        )
    if text.data.get("model_type", model_type) != model_type:
        raise text.error("model_type", f"{shown_value(text.data['model_type'])}, where {model_type} is expected")
    cfg.notes.append(
        "the language model of text_config is converted, as transformers' AutoModelForCausalLM builds it; "
        "the vision encoder (vision_config) is not counted"
    )
    if "tie_word_embeddings" in cfg.data and cfg.data["tie_word_embeddings"] != text.data.get(
        "tie_word_embeddings", False
    ):
        cfg.notes.append("tie_word_embeddings is not read at the top level: the language model reads text_config's")
    return text


def from_hf_config(source: str | Path | dict[str, Any], name: str = "converted") -> dict[str, Any]:
    """The spec data (for spec_from_data, or YAML) of a Hugging Face config.json (a path, or the
    parsed JSON object) of a hybrid family this module knows (FAMILIES)."""
    return read_hf_config(source, name).data


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def to_hf_config(spec: Any, model_type: str) -> dict[str, Any]:
    """The config.json fields of the family `model_type` that describe a spec's stack (a Spec or a path);
    a vision-language type (qwen3_5, qwen3_5_moe) states the stack as its text_config, the vision
    encoder at its class's defaults (AutoModelForCausalLM builds the language model alone from it)."""
    from madsl.lang.spec import Spec, load_spec

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    if model_type in LANGUAGE_MODELS:
        text = family(LANGUAGE_MODELS[model_type]).write(spec)
        tied = text.get("tie_word_embeddings", False)
        return {"model_type": model_type, "text_config": text, "tie_word_embeddings": tied}
    return family(model_type).write(spec)
