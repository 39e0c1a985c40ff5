"""MQAR (zoology's multi-query associative recall): the layout rules, checked on generated data."""

from __future__ import annotations

import numpy as np
import pytest

from madsl.tasks import IGNORE, get_task
from madsl.tasks.mqar import power_law_slots

TASK = get_task("mqar")
SETTING = TASK.settings(vocab_size=64, seq_len=64, num_kv_pairs=8, num_train_examples=2000, num_test_examples=50)


def _decode(data, s):
    pairs = s["num_kv_pairs"]
    keys, values = data.inputs[:, 0 : 2 * pairs : 2], data.inputs[:, 1 : 2 * pairs : 2]
    return keys, values


def test_pairs_then_every_key_queried_once_and_scored_on_its_value():
    s = SETTING
    data = TASK.generate(s, "train", 0)
    half, pairs = s["vocab_size"] // 2, s["num_kv_pairs"]
    keys, values = _decode(data, s)
    assert ((1 <= keys) & (keys < half)).all() and ((half <= values) & (values < s["vocab_size"])).all()
    assert all(len(set(row)) == pairs for row in keys) and all(len(set(row)) == pairs for row in values)
    assert (data.targets[:, : 2 * pairs] == IGNORE).all()  # the pairs themselves are not scored
    scored = data.targets != IGNORE
    assert (scored.sum(1) == pairs).all()
    rows, positions = np.nonzero(scored)
    assert ((positions - 2 * pairs) % 2 == 0).all()  # queries sit at even offsets after the pairs
    for row, position in zip(rows[:400], positions[:400]):
        query = data.inputs[row, position]
        (index,) = np.nonzero(keys[row] == query)[0]
        assert data.targets[row, position] == values[row, index]
    # each key comes back exactly once
    queried = np.sort(data.inputs[scored].reshape(-1, pairs), axis=1)
    np.testing.assert_array_equal(queried, np.sort(keys, axis=1))


def test_the_test_split_scores_the_same_positions_as_training():
    test = TASK.generate(SETTING, "test", 0)
    assert ((test.targets != IGNORE).sum(1) == SETTING["num_kv_pairs"]).all()


def test_query_slots_follow_zoology_s_power_law():
    """The slots are numpy's choice(space, k, replace=False, p ∝ a·i^(a−1)), as zoology draws
    them: the marginal frequency of every slot agrees with that sampler's within sampling error,
    and one draw alone follows p itself."""
    space, k, a, n = 24, 8, 0.01, 8_000
    p = a * np.arange(1, space + 1) ** (a - 1)
    p /= p.sum()
    ours = power_law_slots(np.random.default_rng(0), n, space, k, a)
    assert all(len(set(row)) == k for row in ours[:500])
    reference_rng = np.random.default_rng(1)
    reference = np.stack([reference_rng.choice(space, k, replace=False, p=p) for _ in range(n)])
    ours_freq = np.bincount(ours.ravel(), minlength=space) / ours.size
    ref_freq = np.bincount(reference.ravel(), minlength=space) / reference.size
    assert np.abs(ours_freq - ref_freq).max() < 0.01  # ~5 standard errors at n·k = 64k draws
    single = power_law_slots(np.random.default_rng(2), n, space, 1, a).ravel()
    freq = np.bincount(single, minlength=space) / n
    chi2 = n * ((freq - p) ** 2 / p).sum()
    assert chi2 < 60  # 23 degrees of freedom: p < 1e-4 of exceeding by chance
    assert freq[0] > 0.1 and freq[0] > 3 * freq[-1]  # a power law: near slots far likelier than far ones


def test_generated_slots_match_the_power_law_in_the_sequences():
    s = SETTING
    data = TASK.generate(s, "train", 0)
    pairs, space = s["num_kv_pairs"], (s["seq_len"] - 2 * s["num_kv_pairs"]) // 2
    _, positions = np.nonzero(data.targets != IGNORE)
    slots = (positions - 2 * pairs) // 2
    reference = power_law_slots(np.random.default_rng(5), len(data.inputs), space, pairs, s["power_a"])
    ours = np.bincount(slots, minlength=space) / slots.size
    ref = np.bincount(reference.ravel(), minlength=space) / reference.size
    assert np.abs(ours - ref).max() < 0.01


def test_other_positions_are_uniform_noise_over_the_vocabulary():
    s = SETTING
    data = TASK.generate(s, "train", 0)
    region = data.inputs[:, 2 * s["num_kv_pairs"] :]
    noise = region[data.targets[:, 2 * s["num_kv_pairs"] :] == IGNORE]
    counts = np.bincount(noise, minlength=s["vocab_size"])
    assert counts.min() > 0.6 * counts.mean()  # every token, blank included, in roughly equal number
    blank = TASK.generate({**s, "random_non_queries": False}, "train", 0)
    region = blank.inputs[:, 2 * s["num_kv_pairs"] :]
    assert (region[blank.targets[:, 2 * s["num_kv_pairs"] :] == IGNORE] == 0).all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(seq_len=60, num_kv_pairs=16), "at least 4 x num_kv_pairs"),
        (dict(seq_len=63), "seq_len must be even"),
        (dict(vocab_size=16, num_kv_pairs=8, seq_len=64), "at most vocab_size / 2 - 1"),
        (dict(power_a=0.0), "power_a"),
    ],
)
def test_bad_settings_name_the_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        TASK.generate(TASK.settings(**{**SETTING, **overrides}), "train", 0)


def test_standard_settings_are_zoology_s():
    assert TASK.baseline["vocab_size"] == 8192 and TASK.baseline["power_a"] == 0.01
    for s in TASK.sweep_settings():
        TASK.check(s)
    assert {s["seq_len"] for s in TASK.sweep_settings()} == {64, 128, 256, 512}
    assert {s["num_kv_pairs"] for s in TASK.sweep_settings()} == {4, 8, 16, 32, 64}
