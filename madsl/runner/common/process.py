"""Who owns a run and whether that process lives: the owner tag a claim records (host:pid),
and the checks that let a run whose process died be taken over (the results store) and a
checkpoint's temporary file of a dead writer be cleared (training)."""

from __future__ import annotations

import os
import socket


def owner_tag() -> str:
    """This process, as a claim in the results store names it (host:pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with this pid exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_is_dead(owner: str | None, heartbeat: float | None, stale_after_s: float, now: float) -> bool:
    """A running run's owner is gone: its pid is dead on this host, or its heartbeat is stale."""
    if owner is None or heartbeat is None:
        return True
    host, _, pid = owner.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
        return True
    return now - heartbeat > stale_after_s
