"""Task generators: the interface every task keeps, the registry, and the MAD tasks' properties."""

from __future__ import annotations

import ast
import pathlib
import time

import numpy as np
import pytest

from madsl.tasks import IGNORE, MAD_TASKS, TASKS, get_task, sampling

# Small settings per task, so the whole suite stays fast; properties do not depend on size.
SMALL = {
    "in-context-recall": dict(seq_len=32, num_train_examples=300, num_test_examples=60),
    "noisy-in-context-recall": dict(seq_len=40, num_train_examples=300, num_test_examples=60),
    "fuzzy-in-context-recall": dict(seq_len=48, num_train_examples=300, num_test_examples=60),
    "selective-copying": dict(seq_len=32, num_tokens_to_copy=6, num_train_examples=300, num_test_examples=60),
    "selective-copying-long": dict(seq_len=96, num_tokens_to_copy=8, num_train_examples=100, num_test_examples=20),
    "compression": dict(seq_len=12, num_train_examples=300, num_test_examples=60),
    "memorization": dict(vocab_size=32, num_test_examples=60),
    "induction-heads": dict(seq_len=32, num_train_examples=300, num_test_examples=60),
    "associative-recall": dict(seq_len=64, num_train_examples=300, num_test_examples=60),
    "majority": dict(seq_len=33, num_train_examples=300, num_test_examples=60),
    "counting": dict(seq_len=32, num_train_examples=300, num_test_examples=60),
    "icl-linear": dict(seq_len=17, input_dim=3, num_train_examples=300, num_test_examples=60),
    "arithmetic": dict(num_digits=3, num_train_examples=300, num_test_examples=60),
    "mqar": dict(vocab_size=64, seq_len=32, num_kv_pairs=4, num_train_examples=300, num_test_examples=60),
}
ALL = sorted(name for name, task in TASKS.items() if task.generated)  # tests/test_text_classification.py: the rest


def small(name: str, **overrides):
    task = get_task(name)
    return task, task.settings(**{**SMALL[name], **overrides})


def row_set(array: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in array.reshape(len(array), -1)}


# ---------------------------------------------------------------- registry


def test_registry_names_and_mad_order():
    assert set(ALL) == set(SMALL)
    assert set(TASKS) - set(ALL) == {"text-classification"}  # data read from the user's files
    assert MAD_TASKS == (
        "in-context-recall",
        "fuzzy-in-context-recall",
        "noisy-in-context-recall",
        "selective-copying",
        "compression",
        "memorization",
    )
    assert all(TASKS[name].name == name for name in TASKS)


def test_get_task_suggests_close_names():
    assert get_task("compression") is TASKS["compression"]
    with pytest.raises(KeyError, match="did you mean 'selective-copying'"):
        get_task("selective-coping")
    with pytest.raises(KeyError, match="no task 'xyz'"):
        get_task("xyz")


def test_tasks_package_never_imports_torch():
    package = pathlib.Path(__file__).resolve().parents[1] / "madsl" / "tasks"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            assert not any(m.split(".")[0] == "torch" for m in modules), path.name


# ---------------------------------------------------------------- every task


@pytest.mark.parametrize("name", ALL)
def test_deterministic_per_seed_and_split(name):
    task, s = small(name)
    a, b = task.generate(s, "train", 7), task.generate(s, "train", 7)
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.targets, b.targets)
    other_seed = task.generate(s, "train", 8)
    assert not np.array_equal(a.inputs, other_seed.inputs)
    test = task.generate(s, "test", 7)
    assert not row_set(test.inputs) & row_set(a.inputs)  # independent streams, disjoint sets


@pytest.mark.parametrize("name", ALL)
def test_shapes_dtypes_and_bounds(name):
    task, s = small(name)
    n_classes = task.num_classes(s)
    for split in ("train", "test"):
        data = task.generate(s, split, 0)
        n = s[f"num_{split}_examples"]
        assert len(data.inputs) == len(data.targets) == n
        if task.head == "regress":
            assert data.inputs.dtype == np.float32 and data.inputs.ndim == 3
            assert data.inputs.shape[2] == task.input_dim(s)
            assert data.targets.dtype == np.float32 and data.targets.shape == data.inputs.shape[:2]
            assert np.isfinite(data.targets).any()
            continue
        assert data.inputs.dtype == np.int64 and data.inputs.ndim == 2
        assert data.targets.dtype == np.int64
        assert 0 <= data.inputs.min() and data.inputs.max() < task.vocab_size(s)
        scored = data.targets[data.targets != IGNORE]
        assert scored.size and 0 <= scored.min() and scored.max() < n_classes
        if task.head == "lm":
            assert data.targets.shape == data.inputs.shape
        elif task.head == "classify":
            assert data.targets.shape == (n,)
        if "seq_len" in s:
            assert data.inputs.shape[1] == s["seq_len"]
        assert data.meta["vocab"] == task.vocab(s).layout()


@pytest.mark.parametrize("name", ALL)
def test_baseline_and_sweep_are_well_formed(name):
    task = get_task(name)
    assert {"num_train_examples", "num_test_examples"} <= set(task.baseline)
    assert task.source
    for knob, values in task.sweep.items():
        assert knob in task.baseline and task.baseline[knob] in values and len(set(values)) == len(values)
    settings = task.sweep_settings()
    assert settings[0] == dict(task.baseline)
    for s in settings[1:]:  # one knob at a time
        assert sum(s[k] != task.baseline[k] for k in s) == 1
    for s in settings:
        task.check(s)  # every point of the sweep is a valid setting


def test_unknown_setting_is_a_key_error_and_missing_ones_come_from_baseline():
    task = get_task("compression")
    with pytest.raises(KeyError, match="no setting 'seq_length'"):
        task.generate({"seq_length": 8}, "train", 0)
    data = task.generate({"num_train_examples": 5}, "train", 0)
    assert data.inputs.shape == (5, task.baseline["seq_len"])


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("in-context-recall", dict(vocab_size=15), "vocab_size must be even"),
        ("in-context-recall", dict(seq_len=1), "seq_len must be an integer >= 2"),
        ("noisy-in-context-recall", dict(frac_noise=1.0), "frac_noise"),
        ("noisy-in-context-recall", dict(noise_vocab_size=0), "noise_vocab_size must be >= 1"),
        ("fuzzy-in-context-recall", dict(vocab_size=4), "too few"),
        ("fuzzy-in-context-recall", dict(seq_len=8), "seq_len must be >= 11"),
        ("selective-copying", dict(num_tokens_to_copy=129), "does not fit in seq_len=256"),
        ("selective-copying", dict(vocab_size=0), "vocab_size must be an integer >= 1"),
        ("compression", dict(seq_len=1.5), "seq_len must be an integer"),
        ("memorization", dict(seq_len=31), "seq_len must be even"),
        ("memorization", dict(num_train_examples=0), "num_train_examples must be an integer >= 1"),
        ("associative-recall", dict(seq_len=1023), "seq_len must be even"),
        ("induction-heads", dict(seq_len=2), "seq_len must be an integer >= 3"),
        ("icl-linear", dict(input_dim=0), "input_dim"),
        ("arithmetic", dict(num_digits=0), "num_digits"),
    ],
)
def test_bad_settings_name_the_setting(name, overrides, message):
    task = get_task(name)
    with pytest.raises(ValueError, match=message):
        task.generate(task.settings(**overrides), "train", 0)


def test_check_alone_rejects_bad_split_sizes():
    task = get_task("selective-copying")  # the runner calls check() before it schedules runs
    with pytest.raises(ValueError, match="num_test_examples must be an integer >= 1"):
        task.check(task.settings(num_test_examples=0))


def test_bad_seed_and_split():
    task, s = small("compression")
    with pytest.raises(ValueError, match="seed"):
        task.generate(s, "train", -1)
    with pytest.raises(ValueError, match="split"):
        task.generate(s, "valid", 0)


# ---------------------------------------------------------------- train/test disjointness


def test_test_rows_that_occur_in_train_are_redrawn():
    # 2 keys, 2 values, 3 pairs: few distinct sequences, so overlaps are certain without the redraw
    task, s = small("in-context-recall", vocab_size=4, seq_len=6, num_train_examples=40, num_test_examples=20)
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)
    assert test.meta["num_resampled"] > 0
    assert not row_set(test.inputs) & row_set(train.inputs)
    again = task.generate(s, "test", 0)  # the redraws are seeded too
    np.testing.assert_array_equal(test.inputs, again.inputs)


def test_arithmetic_baseline_needs_and_gets_the_redraw():
    task = get_task("arithmetic")  # 2-digit sums: 10**4 problems, 2000 train
    train, test = task.generate(task.baseline, "train", 0), task.generate(task.baseline, "test", 0)
    assert test.meta["num_resampled"] > 0
    assert not row_set(test.inputs) & row_set(train.inputs)


def test_impossible_disjoint_test_set_is_a_value_error():
    task, s = small("in-context-recall", vocab_size=2, seq_len=4)  # one key, one value: one sequence
    with pytest.raises(ValueError, match="too few distinct sequences"):
        task.generate(s, "test", 0)


def test_overlap_check_is_skipped_only_when_negligible(monkeypatch):
    calls = []
    original = sampling.SampledTask._redraw_overlap
    monkeypatch.setattr(
        sampling.SampledTask, "_redraw_overlap", lambda self, *a: calls.append(self.name) or original(self, *a)
    )
    for name in MAD_TASKS:  # at the paper's baselines an overlap is below 2**-40
        task = get_task(name)
        task.generate(task.settings(num_train_examples=64, num_test_examples=8), "test", 0)
    assert calls == []
    task, s = small("arithmetic", num_digits=2)
    task.generate(s, "test", 0)
    assert calls == ["arithmetic"]


def test_row_hashes_equal_rows_hash_equal():
    rows = np.random.default_rng(0).integers(0, 5, (100, 3))
    hashes = sampling.row_hashes(rows)
    for i in range(100):
        for j in range(100):
            if np.array_equal(rows[i], rows[j]):
                assert hashes[i] == hashes[j]
    assert len(set(hashes.tolist())) == len(row_set(rows))


# ---------------------------------------------------------------- MAD sweeps (App. B.2)

RECALL_SWEEP = {
    "seq_len": (128, 256, 512, 1024),
    "num_train_examples": (12_800, 6_400, 3_200, 1_600, 800),
    "vocab_size": (16, 32, 64, 128),
}


def test_mad_baselines_and_sweeps_match_the_paper():
    b = {name: get_task(name).baseline for name in MAD_TASKS}
    for name in ("in-context-recall", "fuzzy-in-context-recall", "noisy-in-context-recall"):
        assert b[name]["vocab_size"] == 16 and b[name]["seq_len"] == 128
        assert b[name]["num_train_examples"] == 12_800 and b[name]["num_test_examples"] == 1_280
        assert {k: v for k, v in get_task(name).sweep.items() if k != "frac_noise"} == RECALL_SWEEP
    assert b["noisy-in-context-recall"]["frac_noise"] == 0.2 and b["noisy-in-context-recall"]["noise_vocab_size"] == 16
    assert get_task("noisy-in-context-recall").sweep["frac_noise"] == (0.2, 0.4, 0.6, 0.8)
    assert b["fuzzy-in-context-recall"]["max_key_len"] == b["fuzzy-in-context-recall"]["max_value_len"] == 3
    assert b["selective-copying"] == {
        "vocab_size": 16,
        "seq_len": 256,
        "num_tokens_to_copy": 16,
        "num_train_examples": 12_800,
        "num_test_examples": 1_280,
    }
    assert get_task("selective-copying").sweep == {
        "seq_len": (256, 512, 1024),
        "num_train_examples": (12_800, 6_400, 3_200, 1_600, 800),
        "vocab_size": (16, 32, 64, 128),
        "num_tokens_to_copy": (16, 32, 64, 96),
    }
    assert b["compression"] == {
        "vocab_size": 16,
        "seq_len": 32,
        "num_train_examples": 12_800,
        "num_test_examples": 1_280,
    }
    assert get_task("compression").sweep == {
        "seq_len": (32, 64, 128, 256),
        "vocab_size": (16, 32, 64, 128),
        "num_train_examples": (12_800, 6_400, 3_200, 1_600, 800),
    }
    assert b["memorization"] == {
        "vocab_size": 256,
        "seq_len": 32,
        "num_train_examples": 256,
        "num_test_examples": 1_280,
    }
    assert get_task("memorization").sweep == {"vocab_size": (256, 512, 1024, 2048, 4096, 8192)}
    # each fact is shown 32 times on average at the baseline (App. B.1.6): 256 * 16 pairs / 128 keys
    assert 256 * 32 // 2 // (256 // 2) == 32


@pytest.mark.parametrize("name", MAD_TASKS)
def test_mad_baselines_generate_at_full_size(name, record_property):
    task = get_task(name)
    start = time.perf_counter()
    for split in ("train", "test"):
        data = task.generate(task.baseline, split, 0)
        assert len(data.inputs) == task.baseline[f"num_{split}_examples"]
    record_property("generate_seconds", round(time.perf_counter() - start, 3))  # measured, not asserted


# ---------------------------------------------------------------- in-context recall


def pairs_of(inputs: np.ndarray, num_keys: int):
    """(row, key, value) of every key token followed by a value token."""
    is_key = inputs[:, :-1] < num_keys
    is_value = (inputs[:, 1:] >= num_keys) & (inputs[:, 1:] < 2 * num_keys)
    rows, cols = np.nonzero(is_key & is_value)
    return rows, inputs[rows, cols], inputs[rows, cols + 1]


def assert_one_value_per_key_and_varied_maps(inputs: np.ndarray, num_keys: int):
    rows, keys, values = pairs_of(inputs, num_keys)
    pairs = np.unique(np.stack([rows, keys, values]), axis=1)
    row_key = pairs[0] * num_keys + pairs[1]
    assert len(np.unique(row_key)) == len(row_key)  # every (sequence, key) has one value
    value_of_key0 = values[keys == 0]
    assert len(np.unique(value_of_key0)) > 1  # the map changes across sequences


@pytest.mark.parametrize("name", ["in-context-recall", "noisy-in-context-recall"])
def test_recall_train_is_next_token_and_test_scores_seen_keys(name):
    task, s = small(name)
    num_keys = s["vocab_size"] // 2
    train = task.generate(s, "train", 0)
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])
    test = task.generate(s, "test", 0)
    assert_one_value_per_key_and_varied_maps(train.inputs, num_keys)
    assert_one_value_per_key_and_varied_maps(test.inputs, num_keys)
    for inputs_row, targets_row in zip(test.inputs, test.targets):
        stream = np.append(inputs_row, targets_row[-1])  # the last target is the stream's last token
        full = stream[1:]
        expected = np.full(len(inputs_row), IGNORE)
        seen = set()
        for t in range(len(inputs_row)):
            if inputs_row[t] < num_keys:
                if inputs_row[t] in seen and full[t] != IGNORE and num_keys <= full[t] < 2 * num_keys:
                    expected[t] = full[t]
                seen.add(int(inputs_row[t]))
        scored = targets_row != IGNORE
        np.testing.assert_array_equal(targets_row[:-1], expected[:-1])
        assert not scored[-1] or targets_row[-1] >= num_keys


def test_plain_recall_alternates_keys_and_values():
    task, s = small("in-context-recall")
    inputs = task.generate(s, "train", 0).inputs
    assert (inputs[:, 0::2] < 8).all() and (inputs[:, 1::2] >= 8).all()


@pytest.mark.parametrize("frac", [0.2, 0.4, 0.6, 0.8])
def test_noisy_recall_noise_share(frac):
    task, s = small("noisy-in-context-recall", frac_noise=frac, seq_len=128)
    inputs = task.generate(s, "train", 0).inputs
    noise = inputs >= s["vocab_size"]
    assert abs(noise.mean() - frac) < 1.5 / s["seq_len"]
    assert (inputs < s["vocab_size"] + s["noise_vocab_size"]).all()
    # the noise sits between pairs: every key token is followed by a value (or is the last token)
    is_key = inputs[:, :-1] < s["vocab_size"] // 2
    nxt = inputs[:, 1:]
    assert ((nxt[is_key] >= s["vocab_size"] // 2) & (nxt[is_key] < s["vocab_size"])).all()
    # ... and its pattern varies between sequences
    assert len(row_set(noise)) > len(noise) // 2


# ---------------------------------------------------------------- fuzzy recall


def parse_runs(row: np.ndarray, num_keys: int, pad: int):
    """Split a fuzzy row into (key tuple, value tuple, value start) pairs, skipping leading pads."""
    tokens = [int(t) for t in row if t != pad]
    assert all(t != pad for t in row[len(row) - len(tokens) :])  # pads only at the start
    pairs, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] < num_keys:
            j += 1
        k = j
        while k < len(tokens) and tokens[k] >= num_keys:
            k += 1
        pairs.append((tuple(tokens[i:j]), tuple(tokens[j:k]), len(row) - len(tokens) + j))
        i = k
    return pairs


def test_fuzzy_recall_structure_and_scoring():
    task, s = small("fuzzy-in-context-recall")
    num_keys, pad = s["vocab_size"] // 2, task.vocab(s).token("pad")
    train = task.generate(s, "train", 0)
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])
    key_lengths = set()
    for row, last in zip(train.inputs, train.targets[:, -1]):
        pairs = parse_runs(np.append(row, last), num_keys, pad)
        key_lengths |= {len(k) for k, _, _ in pairs if k}
        mapping = {}
        for key, value, _ in pairs[:-1]:  # the final value may be cut by the sequence end
            assert 1 <= len(key) <= 3 and 1 <= len(value) <= 3 and len(set(key)) == len(key)
            assert mapping.setdefault(key, value) == value
    assert key_lengths == {1, 2, 3}

    test = task.generate(s, "test", 0)
    for row, targets in zip(test.inputs, test.targets):
        stream = np.append(row, targets[-1])  # the last token of a test row is always scored
        pairs = parse_runs(stream, num_keys, pad)
        expected = np.full(len(stream), IGNORE)
        seen = {}
        for key, value, start in pairs:
            assert len(key) == 3  # evaluated with keys of maximal length
            if key in seen:
                assert seen[key] == value
                expected[start : start + len(value)] = value
            seen.setdefault(key, value)
        np.testing.assert_array_equal(targets, expected[1:])
        assert (targets != IGNORE).any()  # the final probe repeats an earlier key
        assert pairs[-1][0] in {k for k, _, _ in pairs[:-1]}


# ---------------------------------------------------------------- selective copying


@pytest.mark.parametrize("name", ["selective-copying", "selective-copying-long"])
def test_selective_copying_targets_are_the_data_tokens_in_order(name):
    task, s = small(name)
    vocab, copies, seq_len = task.vocab(s), s["num_tokens_to_copy"], s["seq_len"]
    for split in ("train", "test"):
        data = task.generate(s, split, 0)
        region = data.inputs[:, : seq_len - copies]
        assert (data.inputs[:, seq_len - copies :] == vocab.token("insert")).all()
        is_data = region < s["vocab_size"]
        assert (is_data.sum(axis=1) == copies).all()
        assert ((region == vocab.token("blank")) | is_data).all()
        np.testing.assert_array_equal(data.targets[:, seq_len - copies :], region[is_data].reshape(-1, copies))
        assert (data.targets[:, : seq_len - copies] == IGNORE).all()
        assert len(row_set(is_data)) > len(is_data) // 2  # positions vary between sequences
    assert task.vocab_size(s) == s["vocab_size"] + 2


def test_selective_copying_long_counts_16_tokens_like_mamba():
    task = get_task("selective-copying-long")
    assert task.vocab_size(task.baseline) == 16 and task.baseline["seq_len"] == 4096
    assert task.baseline["num_tokens_to_copy"] == 16


# ---------------------------------------------------------------- compression


def test_compression_targets_are_the_inputs_before_the_compression_token():
    task, s = small("compression")
    assert task.head == "compression"
    data = task.generate(s, "train", 0)
    assert data.targets.shape == (s["num_train_examples"], s["seq_len"] - 1)
    assert (data.inputs[:, -1] == task.vocab(s).token("compress")).all()
    np.testing.assert_array_equal(data.targets, data.inputs[:, :-1])
    assert (data.targets < s["vocab_size"]).all()
    assert data.meta["compression_position"] == s["seq_len"] - 1


# ---------------------------------------------------------------- memorization


def test_memorization_facts_are_fixed_across_samples_and_splits():
    task, s = small("memorization")
    half, insert = s["vocab_size"] // 2, task.vocab(s).token("insert")
    train, test = task.generate(s, "train", 3), task.generate(s, "test", 3)
    facts = train.meta["facts"]
    np.testing.assert_array_equal(facts, test.meta["facts"])
    assert sorted(facts.tolist()) == list(range(half, 2 * half))  # a bijection onto the values
    for data in (train, test):
        keys = data.inputs[:, 0::2]
        assert (keys < half).all() and (data.inputs[:, 1::2] == insert).all()  # values never shown
        np.testing.assert_array_equal(data.targets[:, 1::2], facts[keys])
        assert (data.targets[:, 0::2] == IGNORE).all()
    assert not np.array_equal(facts, task.generate(s, "train", 4).meta["facts"])  # the facts follow the seed


# ---------------------------------------------------------------- building blocks


def test_first_index_matches_a_loop_and_handles_huge_codes():
    from madsl.tasks.draws import first_index

    rng = np.random.default_rng(0)
    for codes in (rng.integers(0, 5, (20, 30)), rng.integers(0, 5, (20, 30)) * 2**60):
        first = first_index(codes)
        for row, firsts in zip(codes, first):
            for j, code in enumerate(row):
                assert firsts[j] == list(row).index(code)


def test_distinct_tokens_are_distinct_and_uniform():
    from madsl.tasks.draws import distinct_tokens

    tokens = distinct_tokens(np.random.default_rng(0), 4, (30_000,), 3)
    assert all(len(set(t)) == 3 for t in tokens[:1000].tolist())
    counts = np.unique(tokens[:, 0] * 16 + tokens[:, 1] * 4 + tokens[:, 2], return_counts=True)[1]
    assert len(counts) == 24 and counts.min() > 0.8 * 30_000 / 24  # all 4*3*2 ordered triples, evenly
