"""One run's training: the loop, its metrics, optimizer, state and device, its options and precision,
checkpoints, and the task heads."""
