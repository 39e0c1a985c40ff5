"""The runner's shared records, at the bottom of its rooms (every room may import them; they
import no room): the training settings of a run and the options its identity names only off
their defaults (records.py), the choices and numbers each defined once (choices.py: precisions,
MAX_SEED, the optimizers, the training cost of a forward pass), the command-line words every
option table reads (words.py), and who owns a run and whether that process lives (process.py).
"""
