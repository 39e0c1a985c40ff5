"""The results: the SQLite database and its folder (checkpoints, data cache, kept models)."""
