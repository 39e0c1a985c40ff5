"""Zamba2 (Zyphra, `model_type: zamba2`, transformers' Zamba2ForCausalLM): where each checkpoint tensor goes
in the madsl model `madsl convert --from-hf` makes of its config (Mamba-2 layers, the hybrid ones with a use
of a shared transformer block injected before them: `Zs#s0>M2-none`, madsl.interop.huggingface.zamba2).

    model.embed_tokens.weight                              embedding.weight (lm_head: tied to it)
    model.final_layernorm.weight                           final_norm.weight
    model.layers.i.input_layernorm.weight                  body.i.mixer.norm.weight (a Mamba layer)
    model.layers.i.mamba.X                                 body.i.mixer.layer.X (M2, as bamba.py: in_proj,
                                                           out_proj, conv1d -> conv.conv, dt_bias, A_log, D,
                                                           norm.weight -> norm_weight)
    model.layers.i.mamba_decoder.input_layernorm.weight    body.i.mixer.unit.norm.weight (a hybrid layer)
    model.layers.i.mamba_decoder.mamba.X                   body.i.mixer.unit.layer.X (M2, as above)
    model.layers.i.linear.weight                           body.i.mixer.injector.out.weight (the use's own)
    model.layers.j.shared_transformer.                     body.i.mixer.injector.shared. (the core, one
      input_layernorm, self_attn.{q,k,v,o}_proj,             module every use of the block holds):
      pre_ff_layernorm, feed_forward.gate_up_proj,           input_norm, {q,k,v,o}_proj, pre_ff_norm,
      feed_forward.down_proj                                 gate_up, down (weights and biases)
    model.layers.j.shared_transformer.feed_forward.        body.i.mixer.injector.gate_up_adapter.{0,1}
      gate_up_proj_adapter_list.k.{0,1}.weight               (the use's own adapter)
    model.layers.j.shared_transformer.self_attn.           body.i.mixer.injector.{q,k,v}_adapter.{0,1}
      linear_{q,k,v}_adapter_list.k.{0,1}.weight             (use_shared_attention_adapter)

Layer i is the k-th hybrid layer; it uses shared block b = k mod num_mem_blocks, and j is the first hybrid
layer of block b, where transformers' save_pretrained keeps the block (its later uses are tied to it); the
block holds adapter slot k for each of its uses k. A checkpoint that keeps a block under another of its
hybrid layers (older save_pretrained dropped all but one tied name, not always the first), or under every one
of them (its state dict as it stands), imports too: a block's tensors are read from the first of its layers
holding them (`as_spelled`: a layer holds block b where its gate_up adapter slots are b's), and every further
copy must equal that one bit for bit (`copies`). Export writes the layout transformers 5 writes.

The layers compute what transformers' do: the shared block as madsl.layers.zamba says (its test,
tests/test_zamba_shared.py, compares it with Zamba2AttentionDecoderLayer and `linear`), the Mamba-2 as
bamba.py says with dt clamped below at time_step_min (M2's `dt_min`, Zamba2MambaMixer's dt_limit), every
RMSNorm at rms_norm_eps but the Mamba-2 gate's at 1e-5, as the converter builds them; nothing to refuse
beyond what the converter refuses.
"""

from __future__ import annotations

import re
from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Part, Sources, one

MAMBA = (  # madsl's M2 name (after `layer.`) -> Zamba2's (after `mamba.`)
    (r"(in_proj|out_proj)\.(weight|bias)", r"\1.\2"),
    (r"conv\.conv\.(weight|bias)", r"conv1d.\1"),
    (r"(dt_bias|A_log|D)", r"\1"),
    (r"norm_weight", "norm.weight"),
)
CORE = (  # the shared core: madsl's name after `shared.` -> Zamba2's after `shared_transformer.`
    (r"input_norm\.weight", "input_layernorm.weight"),
    (r"([qkvo])_proj\.weight", r"self_attn.\1_proj.weight"),
    (r"pre_ff_norm\.weight", "pre_ff_layernorm.weight"),
    (r"gate_up\.(weight|bias)", r"feed_forward.gate_up_proj.\1"),
    (r"down\.(weight|bias)", r"feed_forward.down_proj.\1"),
)
ADAPTERS = (  # a use's adapters: madsl's name after `injector.` -> Zamba2's after `shared_transformer.`, slot k
    (r"gate_up_adapter\.([01])\.weight", r"feed_forward.gate_up_proj_adapter_list.{k}.\1.weight"),
    (r"([qkv])_adapter\.([01])\.weight", r"self_attn.linear_\1_adapter_list.{k}.\2.weight"),
)
SHARED = re.compile(r"model\.layers\.(\d+)\.shared_transformer\.(.+)")
SLOT = re.compile(r"feed_forward\.gate_up_proj_adapter_list\.(\d+)\.0\.weight")


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing to refuse beyond what the converter refuses: it builds every norm at the eps Zamba2's has,
    the Mamba-2 step's floor at time_step_min, and refuses what madsl's shared block cannot state."""


def _rule(rules: tuple[tuple[str, str], ...], rest: str) -> str | None:
    for pattern, target in rules:
        if re.fullmatch(pattern, rest):
            return re.sub(pattern, target, rest)
    return None


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Zamba2 checkpoint tensor it is."""
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    out: Sources = {
        "embedding.weight": one("model.embed_tokens.weight", state["embedding.weight"]),
        "final_norm.weight": one("model.final_layernorm.weight", state["final_norm.weight"]),
    }
    if "head.weight" in state:  # untied (a stack without hybrid layers may be)
        out["head.weight"] = one("lm_head.weight", state["head.weight"])
    hybrid = sorted({int(name.split(".")[1]) for name in state if ".mixer.injector." in name})
    blocks = _blocks(model, hybrid, int(config.get("num_mem_blocks", 1)))
    for name, shape in state.items():
        match = re.fullmatch(r"body\.(\d+)\.mixer\.(.+)", name)
        if match is None:
            continue
        i, rest = int(match.group(1)), match.group(2)
        if i in hybrid:
            k = hybrid.index(i)
            target = _hybrid(rest, i, k, f"model.layers.{hybrid[blocks[k]]}.shared_transformer.")
        else:
            target = _mamba(rest, f"model.layers.{i}.", "")
        if target is not None:
            out[name] = one(target, shape)
    return out


def _blocks(model: Any, hybrid: list[int], count: int) -> list[int]:
    """The first use of each hybrid layer's shared block, as an index into `hybrid`: use k runs block k mod
    num_mem_blocks, the block the model's k-th injector holds (refused where they differ)."""
    firsts = [k % count for k in range(len(hybrid))]
    for k, i in enumerate(hybrid):
        if model.body[i].mixer.injector.shared is not model.body[hybrid[firsts[k]]].mixer.injector.shared:
            raise MadslError(
                f"the model's hybrid layer {i} (use {k}) does not run shared block {k % count} of {count}, "
                "as Zamba2's k-th hybrid layer runs block k mod num_mem_blocks",
                hint="tag the k-th injector with the (k mod n)-th of n tags: Zs#s0, Zs#s1, Zs#s0, ...",
            )
    return firsts


def _mamba(rest: str, layer: str, inner: str) -> str | None:
    """A Mamba-2 part's tensor (`rest`: after the block's `mixer.`; `inner`: `unit.` in a hybrid layer)."""
    if rest == f"{inner}norm.weight":
        return f"{layer}input_layernorm.weight"
    if rest.startswith(f"{inner}layer."):
        found = _rule(MAMBA, rest[len(inner) + 6 :])
        return None if found is None else f"{layer}mamba.{found}"
    return None


def _hybrid(rest: str, i: int, k: int, block: str) -> str | None:
    """A hybrid layer's tensor: its Mamba-2 (`unit.`) or its use k of the shared block (`injector.`)."""
    if rest.startswith("unit."):
        return _mamba(rest, f"model.layers.{i}.mamba_decoder.", "unit.")
    rest = rest.removeprefix("injector.")
    if rest == "out.weight":
        return f"model.layers.{i}.linear.weight"
    if rest.startswith("shared."):
        found = _rule(CORE, rest[len("shared.") :])
        return None if found is None else block + found
    found = _rule(ADAPTERS, rest)
    return None if found is None else block + found.format(k=k)


def _same_block(sources: Sources, headers: dict) -> dict[int, list[int]]:
    """Each layer the map reads a shared block from -> every layer of the checkpoint holding that block (itself
    first where it does, then in order): the layers whose gate_up adapter slots are the same set."""
    slots: dict[int, set[int]] = {}
    for name in headers:
        found = SHARED.fullmatch(name)
        slot = SLOT.fullmatch(found.group(2)) if found else None
        if slot:
            slots.setdefault(int(found.group(1)), set()).add(int(slot.group(1)))
    wanted: dict[int, set[int]] = {}
    for parts in sources.values():
        found = SHARED.fullmatch(parts[0].name)
        slot = SLOT.fullmatch(found.group(2)) if found else None
        if slot:
            wanted.setdefault(int(found.group(1)), set()).add(int(slot.group(1)))
    return {
        layer: sorted((held for held, got in slots.items() if got == want), key=lambda held: (held != layer, held))
        for layer, want in wanted.items()
    }


def as_spelled(sources: Sources, headers: dict) -> Sources:
    """The map with each shared block's tensors read from the first of the block's layers that holds them,
    where the block's first hybrid layer does not (a checkpoint that kept a later use's tied names)."""
    holders = _same_block(sources, headers)
    out: Sources = {}
    for name, parts in sources.items():
        found = SHARED.fullmatch(parts[0].name)
        if found is None or parts[0].name in headers:
            out[name] = parts
            continue
        layer, rest = int(found.group(1)), found.group(2)
        held = [f"model.layers.{j}.shared_transformer.{rest}" for j in holders.get(layer, [])]
        spelled = next((candidate for candidate in held if candidate in headers), parts[0].name)
        out[name] = (Part(spelled, parts[0].shape),)
    return out


def copies(sources: Sources, headers: dict) -> dict[str, str]:
    """Each further copy of a shared block's tensor the checkpoint holds (under another hybrid layer of the
    same block) -> the tensor the map reads, which it must equal (the state dict of a Zamba2ForCausalLM as it
    stands holds the block under every hybrid layer that uses it)."""
    holders = _same_block(sources, headers)
    read = {parts[0].name for parts in sources.values()}
    out: dict[str, str] = {}
    for name in sorted(read):
        found = SHARED.fullmatch(name)
        if found is None:
            continue
        rest = found.group(2)
        for layer in holders.get(int(found.group(1)), []):
            copy = f"model.layers.{layer}.shared_transformer.{rest}"
            if copy != name and copy in headers and copy not in read:
                out[copy] = name
    return out


# the embeddings are tied (the converter refuses untied ones with hybrid layers): lm_head, where a
# checkpoint holds it, is the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
