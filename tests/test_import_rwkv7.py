"""RWKV-7 as a whole model (flash-linear-attention's RWKV7ForCausalLM, `model_type: rwkv7`): the converter
(madsl/interop/huggingface/rwkv7.py) counts what fla's model counts, layer 0's pre_norm included (the spec's
embedding_norm); a tiny random checkpoint imports with fla's logits through the parallel forward and
through prefill + step, and exports back to a checkpoint transformers' AutoModelForCausalLM loads (with fla
imported) with no missing or unexpected keys; the value residual (R7's value_residual, linked by the
compiler to the first R7 layer), the embedding norm and the fused l2 norm's eps (l2norm_eps) each move the
logits far past the tolerance when left out; the compiler refuses a value residual with no first layer to
read, and the linked model stays exact under the stacked trainer's vmap.

fla runs in a process of its own (tests/fla_reference.py): importing it replaces transformers' Mamba with
fla's in the Auto classes. Tolerance 1e-4 absolute in float32 (logits of about 10): fla's reference
recurrence runs token by token and madsl's forward the chunked form (prefill + step: the recurrence), so
they round differently; the measured errors are about 1e-5."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fla_reference  # noqa: E402

if not fla_reference.available():
    pytest.skip("flash-linear-attention's models (the dev extra)", allow_module_level=True)

from hf_checkpoints import prefill_and_step_error, tokens  # noqa: E402

import madsl  # noqa: E402
from madsl.cli import main  # noqa: E402
from madsl.errors import MadslError  # noqa: E402
from madsl.hf_config import read_hf_config, to_hf_config  # noqa: E402
from madsl.spec import spec_from_data  # noqa: E402

TOLERANCE = 1e-4
TINY = {
    "model_type": "rwkv7",
    "vocab_size": 61,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "head_dim": 16,
    "decay_low_rank_dim": 8,
    "a_low_rank_dim": 8,
    "gate_low_rank_dim": 16,
    "v_low_rank_dim": 8,
}
COUNTED = {
    "defaults": {"model_type": "rwkv7", "vocab_size": 65536, "hidden_size": 768, "num_hidden_layers": 12},
    "tiny": TINY,
    "tied, pre_norm off": {**TINY, "norm_first": False, "tie_word_embeddings": True, "hidden_ratio": 3.5},
    "tied, pre_norm on": {**TINY, "tie_word_embeddings": True},
    "ranks by fla's rule": {
        **TINY,
        **{key: None for key in ("decay_low_rank_dim", "a_low_rank_dim", "gate_low_rank_dim", "v_low_rank_dim")},
    },
    "two layers, num_heads": {
        **TINY,
        "num_hidden_layers": 2,
        "intermediate_size": 100,
        "head_dim": None,
        "num_heads": 2,
    },
}


@pytest.fixture(scope="module")
def fla_counts(tmp_path_factory) -> dict[str, int]:
    path = tmp_path_factory.mktemp("counts") / "configs.json"
    path.write_text(json.dumps(list(COUNTED.values())))
    return dict(zip(COUNTED, json.loads(fla_reference.run("count", str(path)))))


@pytest.mark.parametrize("case", COUNTED)
def test_counts_equal_fla_s(fla_counts, case):
    read = read_hf_config(COUNTED[case])
    assert madsl.account(spec_from_data(read.data)).totals["params"] == fla_counts[case]


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("attn", {"layers": [1], "num_heads": 4}, "softmax attention"),
        ("value_dim", 128, "as wide as hidden_size"),
        ("hidden_act", "relu", "sqrelu"),
        ("norm_bias", False, "have a bias"),
        ("norm_eps", 1e-6, "head_dim x 1e-5"),
    ],
)
def test_what_madsl_cannot_compute_is_refused_by_key(key, value, says):
    with pytest.raises(MadslError, match=says) as error:
        read_hf_config({**TINY, key: value})
    assert key in error.value.render()


def test_written_back_the_same_stack():
    data = read_hf_config(TINY).data
    assert data["embedding_norm"] is True  # norm_first, fla's default
    written = to_hf_config(spec_from_data(data), "rwkv7")
    assert written["norm_first"] is True and written["fuse_norm"] is True and written["v_low_rank_dim"] == 8
    assert {k: v for k, v in read_hf_config(written).data.items() if k != "description"} == {
        k: v for k, v in data.items() if k != "description"
    }
    first_mixing = spec_from_data({**data, "topology": "R7{value_residual=true}-R6c:R7-R6c"})
    with pytest.raises(MadslError, match="every later one mixes in its values"):
        to_hf_config(first_mixing, "rwkv7")


def _fla_logits(folder, ids, command: str = "logits", interpret: bool = False):
    (folder.parent / "ids.json").write_text(json.dumps(ids.tolist()))
    out = folder.parent / f"{folder.name}-{command}.npy"
    args = [str(folder), str(folder.parent / "ids.json"), str(out)] + (["interpret"] if interpret else [])
    printed = fla_reference.run(command, *args, interpret=interpret)
    return torch.from_numpy(np.load(out)), printed


def _imported(tmp_path, interpret: bool = False, **make):
    """A tiny checkpoint made by fla, madsl's import of it, the token ids and fla's logits of them."""
    folder, ids = tmp_path / "ckpt", tokens()
    if interpret:  # fla's fused norms: the logits in Triton's interpreter, a process of their own
        fla_reference.run("make", str(folder), json.dumps(make))
        return madsl.load_pretrained(folder), ids, _fla_logits(folder, ids, interpret=True)[0]
    (tmp_path / "ids.json").write_text(json.dumps(ids.tolist()))
    fla_reference.run("make", str(folder), json.dumps(make), str(tmp_path / "ids.json"), str(tmp_path / "fla.npy"))
    return madsl.load_pretrained(folder), ids, torch.from_numpy(np.load(tmp_path / "fla.npy"))


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    """The default tiny checkpoint, made once for the tests that read it (each gets its own import)."""
    tmp_path = tmp_path_factory.mktemp("rwkv7")
    _, ids, expected = _imported(tmp_path)
    return tmp_path, ids, expected


def _error(model, ids, expected) -> float:
    with torch.no_grad():
        return (model(ids) - expected).abs().max().item()


def test_a_checkpoint_imports_with_fla_s_logits_and_exports_back(default, tmp_path, capsys):
    made, ids, expected = default
    model = madsl.load_pretrained(made / "ckpt")
    assert _error(model, ids, expected) < TOLERANCE and expected.abs().max().item() > 1.0
    assert prefill_and_step_error(model, ids, expected, prompt=5) < TOLERANCE
    # out again: transformers (fla imported) loads it with no missing or unexpected keys and fla's logits
    assert main(["import", str(made / "ckpt"), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "rwkv7", "-o", str(tmp_path / "hf"), "-q"]) == 0
    reloaded, printed = _fla_logits(tmp_path / "hf", ids, "reload")
    assert {key: value for key, value in json.loads(printed).items() if value} == {}
    assert (reloaded - expected).abs().max().item() < TOLERANCE
    # the value residual: unlinked, the later layers mix toward zeros instead of the first layer's values
    layers = [m for m in model.modules() if getattr(m, "value_first", None) is not None]
    assert len(layers) == 2
    for layer in layers:
        layer.value_first = None
    assert _error(model, ids, expected) > 100 * TOLERANCE


def test_layer_0_s_pre_norm_is_the_embedding_norm(default):
    made, ids, expected = default
    model = madsl.load_pretrained(made / "ckpt")
    assert _error(model, ids, expected) < TOLERANCE
    model.embedding_norm = None
    assert _error(model, ids, expected) > 100 * TOLERANCE


def test_tied_checkpoints_with_and_without_pre_norm_import(tmp_path):
    for first in (False, True):
        folder = tmp_path / f"first-{first}"
        folder.mkdir()
        model, ids, expected = _imported(folder, layers=2, norm_first=first, tie_word_embeddings=True)
        assert _error(model, ids, expected) < TOLERANCE
        assert prefill_and_step_error(model, ids, expected, prompt=5) < TOLERANCE


def test_fused_norms_and_the_l2_norm_s_eps(tmp_path):
    """fuse_norm true: fla's Triton LayerNorm, GroupNorm and l2_norm (its eps 1e-6: R7's l2norm_eps) in
    Triton's CPU interpreter, keys as small as the eps, where F.normalize would give another kk."""
    pytest.importorskip("triton")
    model, ids, expected = _imported(tmp_path, interpret=True, fuse_norm=True, key_scale=1e-3)
    assert _error(model, ids, expected) < TOLERANCE
    assert prefill_and_step_error(model, ids, expected, prompt=5) < TOLERANCE
    for module in model.modules():
        if hasattr(module, "l2norm_eps"):
            module.l2norm_eps = 0.0
    assert _error(model, ids, expected) > 100 * TOLERANCE


# ---- the compiler's link, alone ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "topology, says",
    [
        ("R7{value_residual=true}-R6c:R7-R6c", "no R7 layer comes before it"),
        ("R7#a-R6c:R7{value_residual=true}-R6c:R7#a-R6c", "used again by its tag"),
    ],
)
def test_a_value_residual_without_its_first_layer_is_a_located_error(topology, says):
    with pytest.raises(MadslError, match=says) as error:
        madsl.compile(madsl.spec_from_topology(topology, dim=32, vocab=61))
    assert "<topology>:1:1" in error.value.render()


def _linked(seed: int):
    torch.manual_seed(seed)
    spec = madsl.spec_from_topology("Mb:R7-R6c:2R7{value_residual=true}-R6c", dim=32, vocab=61)
    model = madsl.compile(spec, seed=seed).double()
    with torch.no_grad():  # off the structured init, so every mix and LoRA matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_prefill_and_step_equal_the_forward_of_a_linked_model():
    model, ids = _linked(0), tokens()
    with torch.no_grad():
        expected = model(ids)
    assert prefill_and_step_error(model, ids, expected, prompt=4) < 1e-10


def test_a_linked_model_is_exact_under_the_stacked_trainer_s_vmap():
    """As tests/test_member_fold.py checks each layer: vmap over stacked members' parameters through the
    first member's modules (and so its link) equals each member's own forward and gradients."""
    models = [_linked(seed) for seed in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    ids = tokens()

    def loss(model, *state):
        out = torch.func.functional_call(model, state, (ids,)) if state else model(ids)
        return out.square().mean()

    losses = torch.func.vmap(lambda p, b: loss(models[0], p, b))(params, buffers)
    names = list(params)
    grads = torch.autograd.grad(losses.sum(), [params[n] for n in names])
    for m, model in enumerate(models):
        want = loss(model)
        torch.testing.assert_close(losses[m], want, atol=1e-12, rtol=1e-10)
        own = dict(model.named_parameters())
        for name, got, expected in zip(names, grads, torch.autograd.grad(want, [own[n] for n in names])):
            torch.testing.assert_close(got[m], expected, atol=1e-12, rtol=1e-9, msg=name)
