"""glibc's malloc, set once per process for the way the decoder allocates.

A prompt's forward pass makes and drops arrays of a few megabytes per product (a [T, out]
float32 result: 3 MB for SmolLM2's [512, 1536]). Under glibc's defaults each such array is
mapped fresh from the kernel and unmapped when freed (its mmap threshold starts at 128 KB and
rises only as far as the largest chunk freed so far), or the heap top holding it is trimmed back to
the kernel (trim threshold twice that): either way the next array's pages fault in again, one 4 KB
zeroed page at a time, and with two threads the faults also queue on the process's memory lock.
Measured on an Intel Xeon with AMX (family 6 model 167), 2 threads, a 512-token prompt: SmolLM2 Q4_1's
GGUF 1,555 tok/s under the defaults, 2,214 with the two thresholds below; its bf16 copy 10 % faster, Gemma
3's files 1-3 % (runbook/performance.md, twenty-third session). The cost: up to ``TRIM_THRESHOLD`` of
freed memory stays in the process.

Only a Linux process on glibc is changed, and only when the user has not set malloc's thresholds
(``GLIBC_TUNABLES`` naming a ``glibc.malloc`` tunable, or ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_``): those settings stand, and are the way to keep glibc's own behaviour.
"""
from __future__ import annotations

import ctypes
import os
import sys

#: Arrays up to this size come from the heap and are reused, not mapped and unmapped (glibc's
#: largest value for it on 64-bit; bigger arrays are mapped as before).
MMAP_THRESHOLD = 32 << 20
#: Freed memory at the top of the heap is returned to the kernel only beyond this.
TRIM_THRESHOLD = 64 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt's parameter numbers (glibc's malloc.h)
_state: list[bool] = []


def user_set_malloc(environ=os.environ) -> bool:
    """Whether the environment sets glibc malloc's thresholds (then ``keep_freed_arrays`` leaves them)."""
    return ("glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or "MALLOC_MMAP_THRESHOLD_" in environ
            or "MALLOC_TRIM_THRESHOLD_" in environ)


def keep_freed_arrays() -> bool:
    """Set glibc's mmap threshold to ``MMAP_THRESHOLD`` and its trim threshold to ``TRIM_THRESHOLD``,
    once per process (the module docstring says why). Returns whether this process runs with them:
    False off Linux or glibc, when the environment sets the thresholds itself (``user_set_malloc``),
    or when glibc refuses a value. Never raises."""
    if not _state:
        ok = False
        if sys.platform.startswith("linux") and not user_set_malloc():
            try:
                libc = ctypes.CDLL(None)
                if hasattr(libc, "gnu_get_libc_version"):   # glibc: musl's mallopt does nothing
                    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            except (OSError, AttributeError):
                ok = False
        _state.append(ok)
    return _state[0]
