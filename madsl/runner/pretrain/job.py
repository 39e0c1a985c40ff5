"""A pretraining run as a job of the runner's executors: `PretrainJob` carries what a worker needs
(picklable: the sized Spec, the settings, the token folder) and executes itself, reporting the
same events as a MAD run (started, progress, an "epoch" per evaluation, finished), so the
coordinator, the results store, the local and Ray executors, resume after a kill and Ctrl-C work
for it unchanged. Nothing here touches the results store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from madsl.runner.pretrain.recipe import PretrainSettings


class TokenBatches:
    """A run's batches from a token folder: the training batch of each step (from (seed, step)
    alone) and the fixed validation windows, `batch_size` at a time."""

    def __init__(self, tokens: Any, settings: PretrainSettings):
        from madsl.corpus import val_windows

        self.tokens, self.settings = tokens, settings
        self.windows = val_windows(tokens.val, settings.seq_len, settings.eval_tokens)

    def train_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        from madsl.corpus import train_batch

        s = self.settings
        return train_batch(self.tokens.train, s.batch_size, s.seq_len, s.seed, step)

    def eval_batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        x, y = self.windows[0], self.windows[1]
        for start in range(0, x.shape[0], self.settings.batch_size):
            yield x[start : start + self.settings.batch_size], y[start : start + self.settings.batch_size]


def open_text(data_dir: str, dtype: str | None, vocab_size: int | None) -> Any:
    """The token folder a run trains on (validated: madsl.corpus.open_tokens)."""
    from madsl.corpus import open_tokens

    return open_tokens(Path(data_dir), dtype=dtype, vocab_size=vocab_size)


@dataclass
class PretrainJob:
    """One pretraining run for an executor; `execute` trains it and never raises."""

    run_id: str
    spec: Any  # the sized Spec (madsl.scaling.grid)
    settings: PretrainSettings
    data_dir: str
    checkpoint_path: str
    data_dtype: str | None = None
    data_vocab: int | None = None
    device: str = "auto"
    label: str = ""
    keep_best: bool = False  # the coordinator's: pretraining keeps no weights
    checkpoint_every_s: float | None = None

    def build_model(self, vocab_size: int) -> Callable[[], Any]:
        from madsl.compiler import compile_spec

        return lambda: compile_spec(
            self.spec, vocab_size=vocab_size, max_seq_len=self.settings.seq_len, seed=self.settings.seed
        )

    def execute(self, emit: Callable[[Any], None], should_stop: Callable[[], bool]) -> None:
        from madsl.runner.execute.jobs import job_hooks, report_run  # a MAD run's events, the same way
        from madsl.runner.pretrain.loop import pretrain_run

        def train(device: Any) -> tuple[Any, dict]:
            tokens = open_text(self.data_dir, self.data_dtype, self.data_vocab)
            return pretrain_run(
                self.settings,
                self.build_model(tokens.info.vocab_size),
                TokenBatches(tokens, self.settings),
                device=device,
                checkpoint_path=Path(self.checkpoint_path),
                hooks=job_hooks(self, emit, should_stop),
                run_id=self.run_id,
            ), {}

        report_run(self.run_id, self.device, emit, train)
