"""One run's training: the loop, its options and precision, checkpoints, and the task heads."""
