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


class BuildExt(build_ext):
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
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
    ),
    cmdclass={"build_ext": BuildExt},
)
