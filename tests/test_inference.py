"""Model-level recurrent inference: `init_state`, `step`, `prefill`, `generate`.

For every paper spec (and the hybrids: group connections; inline topologies: parallel
mixers and a tag used twice), prefill over a prompt and then one step per token gives the
logits of the parallel forward (float64, weights moved off their initialisation), and the
state measured after L tokens is the accounted fixed state + conv state + KV cache at L.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import madsl
from madsl.spec import spec_from_topology

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
PROMPT, STEPS, VOCAB = 5, 3, 16
SPECS = sorted(ROOT.glob("specs/paper/*.mad")) + sorted(ROOT.glob("specs/hybrid/*.mad"))
TOPOLOGIES = [
    "H#a-Sg:A:H#a-Sg",
    "A{window=3}-Sg:A{window=2,rotary=true}",
    "[H | mA]-MoE:Mb",
    "(2A:2Mb){residual=gated}:(A-Sg){residual=add}:(Mb:H)",
    "((A:A){norm=layer} | Mb:H)x2:(A-Sg | Mb){split=gated, combine=res, residual=add}",
    "[H#a | A]-Sg:H#a-Sg",
    "Mb#t:[A | Mb#t]",
]


def _model(spec) -> torch.nn.Module:
    model = madsl.compile(spec, vocab_size=VOCAB, max_seq_len=PROMPT + STEPS).double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def _check(spec) -> None:
    torch.manual_seed(0)
    model = _model(spec)
    tokens = torch.randint(0, VOCAB, (2, PROMPT + STEPS))
    with torch.no_grad():
        full = model(tokens)
    logits, state = model.prefill(tokens[:, :PROMPT])
    torch.testing.assert_close(logits, full[:, :PROMPT], rtol=1e-9, atol=1e-9)
    for t in range(PROMPT, PROMPT + STEPS):
        before = [{k: v.clone() for k, v in layer.items()} for layer in state]
        logits_t, new_state = model.step(tokens[:, t], state)
        assert all(torch.equal(layer[k], old[k]) for layer, old in zip(state, before) for k in layer)
        state = new_state
        torch.testing.assert_close(logits_t, full[:, t], rtol=1e-9, atol=1e-9)
    totals = madsl.account(spec, seq_len=PROMPT + STEPS).totals
    assert model.state_size(state) == {k: totals[k] for k in ("fixed_state", "conv_state", "kv_cache")}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_prefill_and_step_equal_the_parallel_forward(path):
    _check(madsl.load_spec(path))


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_shared_tags_parallel_mixers_and_groups(topology):
    _check(spec_from_topology(topology))


def test_a_tag_used_twice_has_one_module_and_two_states():
    model = madsl.compile(spec_from_topology("Mb#a:Mb#a"), vocab_size=VOCAB)
    state = model.init_state(3)
    assert len(state) == 2 and state[0]["fixed"] is not state[1]["fixed"]
    assert state[0]["fixed"].shape[0] == 3


def test_step_from_init_state_equals_prefill():
    model = _model(madsl.load_spec(ROOT / "specs/paper/striped-mamba-sg.mad"))
    tokens = torch.randint(0, VOCAB, (2, 4))
    state = model.init_state(2)
    stepped = []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        stepped.append(logits)
    torch.testing.assert_close(torch.stack(stepped, 1), model.prefill(tokens)[0], rtol=1e-9, atol=1e-9)


def test_generate_greedy_continues_with_the_argmax_of_the_parallel_forward():
    model = _model(madsl.load_spec(ROOT / "specs/paper/striped-hyena-sg.mad"))
    prompt = torch.randint(0, VOCAB, (2, 4))
    out = model.generate(prompt, max_new_tokens=3, temperature=0)
    assert out.shape == (2, 7) and torch.equal(out[:, :4], prompt)
    with torch.no_grad():
        for t in range(4, 7):
            assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))
    sampled = model.generate(prompt, 5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    again = model.generate(prompt, 5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, again) and ((sampled >= 0) & (sampled < VOCAB)).all()


def test_a_state_of_another_model_is_refused():
    model = madsl.compile(spec_from_topology("Mb:Mb"), vocab_size=VOCAB)
    other = madsl.compile(spec_from_topology("Mb"), vocab_size=VOCAB)
    with pytest.raises(ValueError, match="does not belong"):
        model.step(torch.zeros(1, dtype=torch.long), other.init_state(1))
    with pytest.raises(ValueError, match="does not belong"):
        other.step(torch.zeros(1, dtype=torch.long), model.init_state(1))
