"""Runs trained together: grid groups, the stacked (vmapped) members and their compiled,
graph-replayed step."""
