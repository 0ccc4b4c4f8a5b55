"""The decoder's malloc settings (ster_py/decoder/heap.py): building a model makes glibc keep a prompt's
megabyte-sized arrays on the heap for reuse, unless the user's environment sets malloc's thresholds.

Each case runs in a fresh interpreter (the setting is per process, and this one's is already made) and
asks where a 16 MB array lands: inside the [heap] mapping (reused memory) or in a mapping of its own (glibc's
default for anything past its 128 KB starting threshold).
"""
import ctypes
import os
import subprocess
import sys

import pytest

from tiny import make_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux")
                                or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"),
                                reason="malloc's thresholds are glibc's (Linux) only")

PROBE = r"""
import sys
import numpy as np
from ster_py.decoder import heap
if sys.argv[1] != "-":
    from ster_py.load import load_model
    load_model(sys.argv[1])
a = np.empty(16 << 20, np.uint8)
a[::4096] = 1
addr = a.ctypes.data
on_heap = False
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        on_heap = on_heap or lo <= addr < hi
print(on_heap, heap.keep_freed_arrays())
"""


def probe(model: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                                                               "MALLOC_TRIM_THRESHOLD_")}
    proc = subprocess.run([sys.executable, "-c", PROBE, model], capture_output=True, text=True, timeout=120,
                          env={**environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("heap")
    make_checkpoint(path, "llama")
    return str(path)


def test_loading_a_model_keeps_large_arrays_on_the_heap(tiny_dir):
    assert probe("-").startswith("False")   # glibc's default: a 16 MB array is mapped on its own
    assert probe(tiny_dir) == "True True"


@pytest.mark.parametrize("env", [{"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
                                 {"MALLOC_TRIM_THRESHOLD_": "131072"}])
def test_the_users_malloc_settings_stand(tiny_dir, env):
    got = probe(tiny_dir, **env)
    assert got.endswith("False")   # ster left malloc alone
    if "GLIBC_TUNABLES" in env:
        assert got == "False False"   # and the user's 128 KB threshold maps the array on its own
