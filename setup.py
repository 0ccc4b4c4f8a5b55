"""Build the Cython kernels in cython/ into ster_py._kernels.<name>.

Every `cython/<name>.pyx` becomes the extension `ster_py._kernels.<name>`,
compiled with -O3 and OpenMP when the compiler accepts -fopenmp (the kernels
use `prange`; without OpenMP they run single-threaded).
"""
import os
import sys
import tempfile
from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _compiler_has_openmp(compiler) -> bool:
    """Compile a tiny OpenMP program with the build's compiler to see if -fopenmp works."""
    if sys.platform == "win32":
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n")
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
            compiler.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=["-fopenmp"])
        except Exception:
            return False
    return True


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        # pip passes no -j: the seven kernels compile side by side, one per core (the install's
        # wait is mostly this compile; a new user measured 2:36 serial against 2:09 on 2 busy cores).
        if not self.parallel:
            self.parallel = _cores()

    def build_extensions(self):
        openmp = _compiler_has_openmp(self.compiler)
        for ext in self.extensions:
            ext.extra_compile_args = ["-O3", "-ffp-contract=off"] + (["-fopenmp"] if openmp else [])
            ext.extra_link_args = ["-fopenmp"] if openmp else []
        super().build_extensions()


extensions = [
    Extension(
        f"ster_py._kernels.{os.path.splitext(os.path.basename(path))[0]}",
        [path],
        include_dirs=[np.get_include(), "cython"],
        depends=sorted(glob("cython/*.h")),  # headers include each other: any change rebuilds
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for path in sorted(glob("cython/*.pyx"))
]

setup(
    ext_modules=cythonize(
        extensions,
        nthreads=_cores(),  # .pyx -> .c, one per core (the generated C is not in the repository)
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
    ),
    cmdclass={"build_ext": BuildExt},
)
