"""`madsl import` of Zamba2 (madsl.weights.zamba2; the way back out: test_export_hf.py): a tiny checkpoint made
here by transformers (7 layers, 4 of them hybrid: every weight random, norms included) loads into the compiled
madsl model with transformers' logits, through the parallel forward and through prefill + step: one shared block
or several (num_mem_blocks 1, 2, 3: use k runs block k mod n), with and without the q/k/v adapters, rotary,
biases, grouped keys, 2 Mamba-2 groups. The Mamba-2 step's floor (M2 `dt_min`, Zamba2's time_step_min) matters
where softplus falls below it. A checkpoint that keeps each shared block under a later use's layer, or under
every use's, imports too (transformers reads both); a copy that differs is refused by name, as is a config
madsl's model cannot state.

Tolerance: 1e-4 absolute on logits up to about 4, float32, as tests/test_import_hf.py argues (measured: about
1e-5 through both paths). The random stack is conditioned so that transformers agrees with itself to 1e-5
between two chunk sizes of its own scan (hf_checkpoints.zamba2); madsl's scan rounds as another chunking does.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import prefill_and_step_error, reference, tokens, zamba2  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.errors import MadslError  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
ADAPTERS = {"use_shared_attention_adapter": True}
SETTINGS = {
    "one block": {},
    "2 blocks, q/k/v adapters, rotary, biases": {"num_mem_blocks": 2, **ADAPTERS, "use_mem_rope": True}
    | {"add_bias_linear": True},
    "3 blocks, grouped keys, rotary": {"num_mem_blocks": 3, "num_key_value_heads": 2, "use_mem_rope": True},
    "2 blocks, q/k/v adapters, no rotary, gelu_pytorch_tanh": {"num_mem_blocks": 2, **ADAPTERS}
    | {"hidden_act": "gelu_pytorch_tanh"},
}


def errors(model, folder: Path, ids) -> tuple[float, float]:
    """(forward, prefill + step) largest logit differences of `model` from transformers' of `folder`."""
    expected = reference(folder, ids)
    assert expected.abs().max().item() > 1.0
    with torch.no_grad():
        forward = (model(ids) - expected).abs().max().item()
        return forward, prefill_and_step_error(model, ids, expected, prompt=9)


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
def test_logits_equal_transformers_through_forward_and_prefill_step(tmp_path: Path, setting: str) -> None:
    folder = zamba2(tmp_path / "ckpt", **SETTINGS[setting])
    model = load_pretrained(folder)
    blocks = SETTINGS[setting].get("num_mem_blocks", 1)
    uses = [layer.mixer.injector for layer in model.body if hasattr(layer.mixer, "injector")]
    assert len({id(use.shared) for use in uses}) == blocks and len({id(use.out) for use in uses}) == 4
    forward, stepped = errors(model, folder, tokens(21))
    assert forward < TOLERANCE and stepped < TOLERANCE


def test_the_step_floor_matters_where_softplus_falls_below_it(tmp_path: Path) -> None:
    folder = zamba2(tmp_path / "ckpt", dt_floor=True)  # layer 0's softplus at 1e-4..1e-3, time_step_min 0.01
    model = load_pretrained(folder)
    mamba = [module for module in model.modules() if type(module).__name__ == "Mamba2"]
    assert len(mamba) == 7 and {m.dt_min for m in mamba} == {0.01}
    ids = tokens(21)
    assert max(errors(model, folder, ids)) < TOLERANCE
    for m in mamba:
        m.dt_min = 0.0  # no floor: layer 0 steps 10 to 100 times shorter
    forward, stepped = errors(model, folder, ids)
    assert forward > 100 * TOLERANCE and stepped > 100 * TOLERANCE


def _rewritten(folder: Path, out: Path, tensors: dict) -> Path:
    shutil.copytree(folder, out)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_a_block_kept_under_a_later_use_or_under_every_use_imports_alike(tmp_path: Path) -> None:
    """Hybrid layers 1, 3, 4, 6 use blocks 0, 1, 0, 1: transformers 5 keeps block 0 under layer 1 and block 1
    under layer 3; older save_pretrained kept one of each block's tied names, not always the first; the state
    dict as it stands holds each block under every use."""
    folder = zamba2(tmp_path / "ckpt", num_mem_blocks=2, **ADAPTERS)
    saved = load_file(folder / "model.safetensors")
    assert {re.sub(r"\.shared_transformer\..*", "", name) for name in saved if ".shared_transformer." in name} == {
        "model.layers.1",
        "model.layers.3",
    }
    later = {
        re.sub(r"layers\.(1|3)\.shared_", lambda m: f"layers.{int(m[1]) + 3}.shared_", k): v for k, v in saved.items()
    }
    whole = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    every = {name: tensor.clone() for name, tensor in whole.items() if name != "lm_head.weight"}
    assert len(every) > len(saved)
    ids = tokens(21)
    for layout, tensors in (("later", later), ("every", every)):
        other = _rewritten(folder, tmp_path / layout, tensors)
        read, info = transformers.AutoModelForCausalLM.from_pretrained(other, output_loading_info=True)
        assert {key: value for key, value in info.items() if value} == {}  # transformers reads it so too
        forward, stepped = errors(load_pretrained(other), folder, ids)
        assert forward < TOLERANCE and stepped < TOLERANCE
    copy = "model.layers.4.shared_transformer.feed_forward.gate_up_proj_adapter_list.2.1.weight"
    every[copy] = every[copy] + 1e-3  # a copy of block 0's slot-2 adapter that is not the original
    with pytest.raises(MadslError, match=re.escape(f"{copy!r} differs from")):
        load_pretrained(_rewritten(folder, tmp_path / "differs", every))


def test_import_on_the_command_line_writes_the_spec_and_refuses_by_key(tmp_path: Path, capsys) -> None:
    folder = zamba2(tmp_path / "ckpt", num_mem_blocks=2)
    assert main(["import", str(folder), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    spec = json.loads((tmp_path / "madsl" / "config.json").read_text())
    assert "Zs#s0>M2-none:M2-none:Zs#s1>M2-none:Zs#s0>M2-none" in json.dumps(spec)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    assert main(["import", str(folder), "--out", str(tmp_path / "untied")]) == 2
    error = capsys.readouterr().err
    assert '"tie_word_embeddings"' in error and "Traceback" not in error and not (tmp_path / "untied").exists()
