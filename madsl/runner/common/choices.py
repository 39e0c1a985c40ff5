"""The choices and fixed numbers the runner's rooms share, each defined once here: the
evaluation settings (madsl.runner.plan.settings), training (madsl.runner.train), the study
files of madsl.scaling and the search files of madsl.search read them from this module.
"""

from __future__ import annotations

# training seeds every generator with a run's seed (torch's take at most 64 bits, the per-epoch
# one seed x 1,000,003): a 32-bit seed fits them all. Search and study files' seeds are held to it too
MAX_SEED = 2**32 - 1

# what a run trains in (a run's identity names it); `auto` is asked for, and resolved to one of
# them when the runs are planned (madsl.runner.train.precision.resolve_precision: the one rule)
TRAIN_PRECISIONS = ("fp32", "bf16")
PRECISIONS = (*TRAIN_PRECISIONS, "auto")

# the choices of the training options (madsl.runner.train.options says what each does)
OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("cosine", "constant")
METRICS = ("macro", "token")
LM_HEADS = ("conventions", "spec")

# a training step costs about three forward passes (forward + backward, the backward twice the
# forward: the usual 6N of 2N FLOPs a token); an evaluation batch, one forward pass: a third of a step
TRAIN_FORWARDS = 3
FORWARD_SHARE = 1 / TRAIN_FORWARDS
