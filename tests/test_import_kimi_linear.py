"""`madsl import` of Kimi Linear (madsl.weights.kimi_linear; the way back out: test_export_hf.py): tiny
checkpoints made here by transformers (KDA and MLA layers, a dense SwiGLU and SwiGLU experts beside a
shared one, routed by sigmoid scores, a random correction bias and routed_scaling_factor 2.5; every
weight random, norms, A_log and dt_bias included), imported, and their logits compared with
transformers' own forward (its PyTorch delta rule: tests/hf_checkpoints.kimi_linear_torch_paths)
through the parallel forward and through prefill + step (KDA's recurrence, MLA's latent cache).

Tolerance: 1e-4 absolute in float32 on sequences of 14 tokens (logits up to 5.7; measured 1.1e-5
and 3.2e-5, through prefill + step 1.1e-5 and 3.1e-5).
Over 70 tokens (past transformers' 64-token chunk of the delta rule) 2e-4: there the random model
amplifies float32 rounding so that transformers' own logits lie 8.9e-5 from the same weights
evaluated in float64 (madsl's model in double precision) and madsl's float32 ones 1.1e-4 from it;
two float32 evaluations cannot be held closer than their distances to the exact one. Both the
float32 and the float64 model are checked against transformers there.

Each option the import sets must matter: KDA's l2norm_eps (transformers' x / sqrt(|x|^2 + 1e-6) for
q and k, not F.normalize) and its output norm at rms_norm_eps move the logits of a checkpoint with
small keys and rms_norm_eps 0.1 by 3.5 and 8.6; the selection bias and the routed scale by 4 to 5.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from hf_checkpoints import kimi_linear, prefill_and_step_error, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.layers.kda import KDA  # noqa: E402
from madsl.layers.moe import MoE  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
LONG_TOLERANCE = 2e-4  # 70 tokens: the module docstring's argument
CHECKPOINTS = {
    "kda mla, experts": {},
    "query bottleneck, attention bias, unnormalised routing, two dense layers, rms_norm_eps 1e-6": {
        "q_lora_rank": 12,
        "attention_bias": True,
        "norm_topk_prob": False,
        "rms_norm_eps": 1e-6,
        "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
    },
}


def _error(model, ids, expected) -> float:
    with torch.no_grad():
        return (model(ids) - expected).abs().max().item()


@pytest.mark.parametrize("case", CHECKPOINTS, ids=CHECKPOINTS)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = kimi_linear(tmp_path / "ckpt", **CHECKPOINTS[case])
    ids = tokens(14)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert _error(model, ids, expected) < TOLERANCE
    with torch.no_grad():
        assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE


def test_a_long_sequence_is_transformers_within_float32_rounding(tmp_path: Path) -> None:
    folder = kimi_linear(tmp_path / "ckpt")
    ids = tokens(70)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert _error(model, ids, expected) < LONG_TOLERANCE
    assert _error(copy.deepcopy(model).double(), ids, expected.double()) < LONG_TOLERANCE  # the exact evaluation
    with torch.no_grad():
        assert prefill_and_step_error(model, ids, expected, prompt=9) < LONG_TOLERANCE


def _small_keys(folder: Path) -> None:
    """KDA's q and k projections scaled by 1e-2: keys whose squared norm is near l2norm's 1e-6."""
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    for name in list(tensors):
        if name.endswith(("q_proj.weight", "k_proj.weight")) and name.replace("_proj", "_conv1d") in tensors:
            tensors[name] = tensors[name] * 1e-2
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})


def test_kda_norms_are_transformers_and_each_matters(tmp_path: Path) -> None:
    folder = kimi_linear(tmp_path / "ckpt", rms_norm_eps=0.1)
    _small_keys(folder)
    ids = tokens(14)
    expected = reference(folder, ids)
    assert _error(load_pretrained(folder), ids, expected) < TOLERANCE
    for change in (lambda kda: setattr(kda, "l2norm_eps", 0.0), lambda kda: setattr(kda.o_norm, "eps", 1e-5)):
        model = load_pretrained(folder)
        for module in model.modules():
            if isinstance(module, KDA):
                change(module)
        assert _error(model, ids, expected) > 1e4 * TOLERANCE


def test_routing_options_matter(tmp_path: Path) -> None:
    """The correction bias picks the experts and routed_scaling_factor weighs them: without either,
    other logits."""
    folder = kimi_linear(tmp_path / "ckpt")
    ids = tokens(14)
    expected = reference(folder, ids)
    for change in (lambda moe: moe.selection_bias.zero_(), lambda moe: moe.routing.update(scale=1.0)):
        model = load_pretrained(folder)
        for module in model.modules():
            if isinstance(module, MoE):
                change(module)
        assert _error(model, ids, expected) > 1e4 * TOLERANCE


def test_moonshot_layout_of_the_dense_layers_imports_alike(tmp_path: Path) -> None:
    """transformers' save_pretrained writes a dense layer's SwiGLU under block_sparse_moe., Moonshot's
    checkpoints under mlp.: both import to the same model."""
    folder = kimi_linear(tmp_path / "ckpt")
    ids = tokens(14)
    before = load_pretrained(folder)
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    moved = {
        re.sub(r"\.block_sparse_moe\.((gate|up|down)_proj\.weight)$", r".mlp.\1", n): t for n, t in tensors.items()
    }
    assert sorted(n for n in moved if ".mlp." in n) == [
        f"model.layers.0.mlp.{m}_proj.weight" for m in ("down", "gate", "up")
    ]
    safetensors_torch.save_file(moved, path, metadata={"format": "pt"})
    after = load_pretrained(folder)
    with torch.no_grad():
        assert torch.equal(before(ids), after(ids))


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"num_expert_group": 2, "topk_group": 1}, "topk_group", "best groups only"),
        ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func", "scores experts by a softmax"),
    ],
)
def test_what_madsl_does_not_route_is_refused_by_key(tmp_path: Path, capsys, change: dict, key: str, message: str):
    folder = kimi_linear(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f'"{key}"' in error and message in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()
