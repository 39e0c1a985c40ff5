"""The tasks beyond MAD: induction heads, associative recall, majority, counting, ICL of linear functions,
arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from madsl.tasks import IGNORE, get_task


def make(name: str, **overrides):
    task = get_task(name)
    s = task.settings(**{"num_train_examples": 300, "num_test_examples": 60, **overrides})
    return task, s


def test_induction_heads_answer_follows_the_first_trigger():
    task, s = make("induction-heads", seq_len=40)
    trigger = task.vocab(s).token("trigger")
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])
    for data in (train, test):
        assert ((data.inputs == trigger).sum(axis=1) == 2).all() and (data.inputs[:, -1] == trigger).all()
        first = (data.inputs == trigger).argmax(axis=1)
        assert (first < s["seq_len"] - 2).all()
        np.testing.assert_array_equal(data.targets[:, -1], data.inputs[np.arange(len(first)), first + 1])
    assert (test.targets[:, :-1] == IGNORE).all()


def test_induction_heads_trains_at_256_and_evaluates_from_64_to_2_20():
    task = get_task("induction-heads")
    assert task.baseline["seq_len"] == 256 and task.baseline["vocab_size"] == 16
    assert task.eval_seq_lens == tuple(2**k for k in range(6, 21))
    for seq_len in (64, 1024):  # the runner draws test sets at other lengths
        data = task.generate(task.settings(seq_len=seq_len, num_test_examples=8), "test", 0)
        assert data.inputs.shape == (8, seq_len)


def test_associative_recall_single_query_at_the_end():
    task, s = make("associative-recall", seq_len=64, vocab_size=20)
    vocab, num_keys = task.vocab(s), s["vocab_size"] // 2
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)
    np.testing.assert_array_equal(train.targets[:, :-1], train.inputs[:, 1:])
    assert (test.targets[:, :-1] == IGNORE).all()
    for data in (train, test):
        assert (data.inputs[:, -2] == vocab.token("separator")).all()
        for row, answer in zip(data.inputs, data.targets[:, -1]):
            keys, values, query = row[0:-2:2], row[1:-2:2], row[-1]
            assert (keys < num_keys).all() and ((values >= num_keys) & (values < 2 * num_keys)).all()
            assert query in keys
            assert set(values[keys == query].tolist()) == {answer}  # one value per key, the answer
    hyena = task.sweep
    assert hyena["vocab_size"] == (10, 20, 30, 40) and hyena["seq_len"][0] == 1024 and hyena["seq_len"][-1] == 131072


def test_majority_target_is_the_unique_most_frequent_token():
    task, s = make("majority", seq_len=21, vocab_size=4)
    assert task.head == "classify" and task.num_classes(s) == 4
    data = task.generate(s, "train", 0)
    assert (data.inputs[:, -1] == task.vocab(s).token("query")).all()
    for row, answer in zip(data.inputs, data.targets):
        counts = np.bincount(row[:-1], minlength=4)
        assert counts[answer] > np.delete(counts, answer).max()


def test_counting_target_is_the_number_of_query_occurrences():
    task, s = make("counting", seq_len=30, vocab_size=5)
    assert task.head == "classify" and task.num_classes(s) == 29
    data = task.generate(s, "test", 0)
    assert (data.inputs[:, -2] == task.vocab(s).token("count")).all()
    for row, count in zip(data.inputs, data.targets):
        assert count == (row[:-2] == row[-1]).sum()
    assert len(np.unique(data.targets)) > 2


def test_icl_linear_targets_are_w_dot_x_per_sequence():
    task, s = make("icl-linear", seq_len=21, input_dim=3)
    assert task.head == "regress" and task.input_dim(s) == 3
    assert task.vocab_size(s) == 1 and task.num_classes(s) == 1  # no tokens; one number per position
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)
    x, w = train.inputs[:, 0::2], train.meta["weights"]
    np.testing.assert_allclose(train.targets[:, 0::2], np.einsum("npd,nd->np", x, w), rtol=1e-5, atol=1e-5)
    assert np.isnan(train.targets[:, 1::2]).all()
    # y tokens are (y, 0, 0) and carry the previous x's target
    np.testing.assert_array_equal(train.inputs[:, 1::2, 0], train.targets[:, 0:-1:2])
    assert (train.inputs[:, 1::2, 1:] == 0).all()
    # w is recoverable from the sequence alone (least squares on the shown pairs)
    solved = np.linalg.lstsq(x[0], train.targets[0, 0::2], rcond=None)[0]
    np.testing.assert_allclose(solved, w[0], rtol=1e-3, atol=1e-3)
    # the test split scores only the final query x
    assert np.isfinite(test.targets[:, -1]).all() and np.isnan(test.targets[:, :-1]).all()
    np.testing.assert_allclose(
        test.targets[:, -1], (test.inputs[:, -1] * test.meta["weights"]).sum(1), rtol=1e-5, atol=1e-5
    )
    assert not np.array_equal(w[0], w[1])


def test_arithmetic_targets_are_the_correct_sums():
    task, s = make("arithmetic", num_digits=5)
    d = s["num_digits"]
    for split in ("train", "test"):
        data = task.generate(s, split, 0)
        assert data.inputs.shape[1] == 3 * d + 2
        assert (data.targets[:, : 2 * d + 1] == IGNORE).all()
        for row, targets in zip(data.inputs, data.targets):
            a = int("".join(map(str, row[:d])))
            b = int("".join(map(str, row[d + 1 : 2 * d + 1])))
            assert row[d] == 10 and row[2 * d + 1] == 11
            assert int("".join(map(str, targets[2 * d + 1 :]))) == a + b
            np.testing.assert_array_equal(row[2 * d + 2 :], targets[2 * d + 1 : -1])


def test_arithmetic_has_no_overflow_at_many_digits():
    task, s = make("arithmetic", num_digits=25, num_train_examples=20, num_test_examples=5)
    row, targets = task.generate(s, "train", 0).inputs[0], task.generate(s, "train", 0).targets[0]
    a, b = int("".join(map(str, row[:25]))), int("".join(map(str, row[26:51])))
    assert int("".join(map(str, targets[51:]))) == a + b


@pytest.mark.parametrize("name", ["associative-recall", "majority", "counting"])
def test_hyena_tasks_sweep_length_and_vocab(name):
    task = get_task(name)
    assert task.baseline["num_train_examples"] == 2_000
    assert set(task.sweep) == {"seq_len", "vocab_size"}
