"""Why a read or a write failed, in words: the one table of errno -> words ("no space left on
device", "permission denied", "not a directory"), for every message madsl writes about its own
files (the results folder, checkpoints, the task data cache, the rate cache).

Below everything that writes files (it imports nothing of madsl), so the task data cache and the
runner share it without one importing the other.
"""

from __future__ import annotations

import errno

OS_ERROR_WORDS = {
    errno.ENOSPC: "no space left on device",
    getattr(errno, "EDQUOT", -1): "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ELOOP: "a symbolic link",
    errno.ENAMETOOLONG: "file name too long",
    errno.EIO: "input/output error",
}


def os_error_words(err: OSError) -> str:
    """Why a read or write failed, in words ("no space left on device", "permission denied",
    "not a directory"), from its errno; else the system's own message."""
    return OS_ERROR_WORDS.get(err.errno) or (err.strerror or str(err) or type(err).__name__).lower()
