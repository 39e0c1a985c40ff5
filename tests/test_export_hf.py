"""`madsl export MODEL_DIR --to-hf MODEL_TYPE` (madsl.weights.export): a checkpoint imported into madsl
and written back out loads in transformers with no missing or unexpected keys and transformers'
logits of the original (within 1e-4 in float32, as tests/test_import_hf.py argues: the exported
config leaves transformers' defaults where the original set a key madsl does not read, such as a
Mamba-2 scan's chunk size, so the scan rounds differently); a model a family cannot hold is
refused by name, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import (  # noqa: E402
    bamba,
    falcon_h1,
    gpt_neo,
    granite,
    jamba,
    kimi_linear,
    lfm2,
    lfm2_moe,
    mamba,
    minimax,
    nemotron_h,
    qwen3_5,
    qwen3_next,
    recurrent_gemma,
    reference,
    tokens,
    xlstm,
    zamba2,
)

from madsl.cli import main  # noqa: E402

TOLERANCE = 1e-4
MOE = {  # Nemotron-H's experts: 4, 2 active, a shared one, routed by sigmoid scores and a correction bias
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 20,
    "routed_scaling_factor": 2.5,
    "moe_latent_size": 16,
}
CHECKPOINTS = {
    "lfm2 tied": ("lfm2", lambda folder: lfm2(folder)),
    "lfm2 untied, biases": ("lfm2", lambda folder: lfm2(folder, tied=False, bias=True)),
    "bamba": ("bamba", lambda folder: bamba(folder)),
    "bamba tied, 1 group": ("bamba", lambda folder: bamba(folder, tied=True, groups=1)),
    "nemotron-h MM-*-M": ("nemotron_h", lambda folder: nemotron_h(folder, "MM-*-M")),
    "jamba, 4 experts": ("jamba", lambda folder: jamba(folder)),
    "granite, 4 experts": ("granitemoehybrid", lambda folder: granite(folder)),
    "granite, no experts": ("granitemoehybrid", lambda folder: granite(folder, experts=0)),
    "lfm2-moe": ("lfm2_moe", lambda folder: lfm2_moe(folder)),
    "nemotron-h ME*E, latent experts": ("nemotron_h", lambda folder: nemotron_h(folder, "ME*E", **MOE)),
    "gpt-neo untied": ("gpt_neo", lambda folder: gpt_neo(folder, tied=False)),
    "mamba tied": ("mamba", lambda folder: mamba(folder)),
    "xlstm": ("xlstm", lambda folder: xlstm(folder)),
    "minimax, residual factors": ("minimax", lambda folder: minimax(folder)),
    "minimax tied, a sliding window": ("minimax", lambda folder: minimax(folder, tied=True, sliding_window=5)),
    "kimi_linear, query bottleneck, bias, 2 dense layers": (
        "kimi_linear",
        lambda f: kimi_linear(f, q_lora_rank=12, attention_bias=True, first_k_dense_replace=2, mlp_layer_types=None),
    ),
    "falcon-h1, µP multipliers": ("falcon_h1", lambda folder: falcon_h1(folder)),
    "falcon-h1 tied, 1 group, biases, gated norm": (
        "falcon_h1",
        lambda folder: falcon_h1(folder, tied=True, groups=1, bias=True, gated_norm=True),
    ),
    "recurrent_gemma tied": ("recurrent_gemma", lambda folder: recurrent_gemma(folder)),
    "recurrent_gemma untied, biases": ("recurrent_gemma", lambda f: recurrent_gemma(f, tied=False, bias=True)),
    "qwen3-next, 4 experts and a dense layer": ("qwen3_next", lambda folder: qwen3_next(folder)),
    "qwen3.5 tied": ("qwen3_5_text", lambda folder: qwen3_5(folder, tie_word_embeddings=True)),
    # a vision-language checkpoint goes out as its language model: alone, or in the vision-language config
    "qwen3.5-moe vision-language": ("qwen3_5_moe_text", lambda folder: qwen3_5(folder, experts=True, vision=True)),
    "qwen3.5-moe vision-language, as such": ("qwen3_5_moe", lambda f: qwen3_5(f, experts=True, vision=True)),
    "qwen3.5 vision-language, as such": ("qwen3_5", lambda folder: qwen3_5(folder, vision=True)),
    "zamba2, 2 shared blocks, q/k/v adapters, rotary, biases": (
        "zamba2",
        lambda f: zamba2(
            f, num_mem_blocks=2, use_shared_attention_adapter=True, use_mem_rope=True, add_bias_linear=True
        ),
    ),
    "zamba2, 3 shared blocks, grouped keys": ("zamba2", lambda f: zamba2(f, num_mem_blocks=3, num_key_value_heads=2)),
    # fla's RWKV7ForCausalLM (AutoModelForCausalLM knows it once fla.models is imported): the pre_norm goes out
    # folded into the embedding table, with norm_first false
}


@pytest.mark.parametrize("case", CHECKPOINTS, ids=CHECKPOINTS)
def test_import_then_export_loads_in_transformers_with_equal_logits(tmp_path: Path, capsys, case: str) -> None:
    model_type, make = CHECKPOINTS[case]
    original = make(tmp_path / "ckpt")
    assert main(["import", str(original), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", model_type, "-o", str(tmp_path / "hf"), "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    exported, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert {key: value for key, value in info.items() if value} == {}  # no missing, unexpected or mismatched keys
    ids = tokens(17)
    with torch.no_grad():
        got = exported.eval()(ids).logits
    assert (got - reference(original, ids)).abs().max().item() < TOLERANCE
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == model_type


def test_a_model_the_family_cannot_hold_is_refused_by_name(tmp_path: Path, capsys) -> None:
    import madsl
    from madsl.compiler import save

    model = madsl.compile(madsl.spec_from_topology("H-Sg:A-Sg", dim=32, vocab=61))
    save(model, tmp_path / "madsl")
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "lfm2", "-o", str(tmp_path / "hf")]) == 2
    error = capsys.readouterr().err
    assert "error:" in error and "Traceback" not in error
    assert not (tmp_path / "hf").exists()


def test_a_runs_kept_language_model_exports_to_the_family_of_its_spec(tmp_path: Path, capsys) -> None:
    """`madsl export RUN_ID --to-hf mamba`: a MAD run of the paper's Mamba on a next-token task,
    kept, goes out as a Mamba checkpoint at the task's vocabulary, with the kept model's logits."""
    import madsl

    spec = tmp_path / "mamba.mad"
    spec.write_text("name: tiny-mamba\ndim: 16\ntopology: 2Mb\nlayers:\n  Mb: {d_state: 4}\n")
    db = tmp_path / "results.db"
    tiny = ["--task", "in-context-recall", "--protocol", "smoke", "--epochs", "1", "--batch-size", "8"]
    tiny += ["--set", "seq_len=32", "--set", "num_train_examples=32", "--set", "num_test_examples=16"]
    assert main(["eval", str(spec), *tiny, "--db", str(db), "--keep", "best", "--format", "json", "-q"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", run_id[:12], "--to-hf", "mamba", "-o", str(tmp_path / "hf"), "--db", str(db), "-q"]) == 0
    assert main(["export", run_id[:12], "-o", str(tmp_path / "run"), "--db", str(db), "-q"]) == 0
    kept = madsl.load_run(tmp_path / "run").backbone
    exported, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert {key: value for key, value in info.items() if value} == {}
    ids = torch.randint(0, kept.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (exported.eval()(ids).logits - kept(ids)).abs().max().item() < TOLERANCE
    # a run read through a head of its own (the reference's conventions) has no language model to write
    mad_lab = ["--conventions", "mad-lab", "--format", "json", "-q"]
    assert main(["eval", str(spec), *tiny, *mad_lab, "--db", str(db), "--keep", "best"]) == 0
    [other] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", other[:12], "--to-hf", "mamba", "-o", str(tmp_path / "hf2"), "--db", str(db)]) == 2
    assert "through a head of its own" in capsys.readouterr().err and not (tmp_path / "hf2").exists()
