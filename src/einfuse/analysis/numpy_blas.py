"""Which kernels NumPy's BLAS runs in this process: OpenBLAS picks one set of kernels
per CPU when it loads (its ``DYNAMIC_ARCH`` builds: "Haswell", "Zen", "SkylakeX",
"Cooperlake", ...; ``OPENBLAS_CORETYPE`` overrides it), and which set it picked decides
whether it or torch's MKL runs a convolution's products faster on an AMD core
(backends/c/windowed.openblas_alone_faster).

Read once per process from the loaded library; "" where NumPy's BLAS is not an
OpenBLAS that says (another BLAS, a static build, no such symbol)."""

from __future__ import annotations

import ctypes
import functools

# OpenBLAS's names of its AVX-512 kernel sets (the cores it maps AVX-512 CPUs to)
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})

# the function that names the kernels, by the prefixes and suffixes builds give it
# (scipy-openblas's wheels: scipy_ and 64_)
_NAMES = ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
          "openblas_get_corename64_", "openblas_get_corename")


@functools.lru_cache(maxsize=1)
def openblas_core() -> str:
    """The name of the kernel set NumPy's OpenBLAS runs (lower case), "" where unknown."""
    import numpy   # (loads the library: its path is then in this process's maps)
    del numpy
    for path in _loaded_openblas():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _NAMES:
            function = getattr(library, name, None)
            if function is None:
                continue
            function.restype = ctypes.c_char_p
            function.argtypes = []
            found = function()
            return found.decode("ascii", "replace").strip().lower() if found else ""
    return ""


def avx512_kernels() -> bool:
    """Whether NumPy's OpenBLAS runs its AVX-512 kernels."""
    return openblas_core() in AVX512_CORES


def _loaded_openblas():
    """The paths of the shared libraries loaded in this process whose name says
    OpenBLAS (Linux: /proc/self/maps; elsewhere none)."""
    seen = []
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if "openblas" in path.rsplit("/", 1)[-1].lower() and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    return seen
