"""Calling a compiled kernel in a few hundred nanoseconds: a tiny CPython extension,
built once per machine like the kernels, that takes the arrays themselves (their data
pointers come from the buffer protocol) and calls the kernel's function pointer.

Through ctypes a repeated call of a 4x4 kernel spent most of its ~7 µs in ``.ctypes.data``
(an object per array), the pointer array and ctypes' argument conversion; here the
same call is one C function.  The GIL is released while the kernel runs, as ctypes does.

Optional: without Python's headers (no python3-dev) or a compiler, :func:`caller` is None
and the fast path keeps calling through ctypes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
from typing import Callable, Optional

from ...errors import EinfuseError
from . import build as c_build

_MODULE = "einfuse_kernel_call"
# The most arrays (inputs and output) one call takes: MAX_BUFFERS of the source below.
MAX_BUFFERS = 64

# The kernel signature of c_render.py: pointers to the buffers, the runtime ints, doubles
# and integer parameters, the pad/fill values, the thread count and the error flag.
_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef void (*kernel_fn)(void **, const int64_t *, const double *, const int64_t *,
                          const double *, int, int32_t *);

#define MAX_BUFFERS 64

/* call(function, arrays, ints, doubles, integers, fills, threads) -> error flag.
   arrays: a tuple of objects with the buffer protocol, the output last (writable). */
static PyObject *call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 7 || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "call(function, arrays, ints, doubles, integers, "
                    "fills, threads)");
    return NULL;
  }
  kernel_fn fn = (kernel_fn)PyLong_AsVoidPtr(args[0]);
  PyObject *arrays = args[1];
  Py_ssize_t n = PyTuple_GET_SIZE(arrays);
  const int64_t *ints = (const int64_t *)PyLong_AsVoidPtr(args[2]);
  const double *doubles = (const double *)PyLong_AsVoidPtr(args[3]);
  const int64_t *integers = (const int64_t *)PyLong_AsVoidPtr(args[4]);
  const double *fills = (const double *)PyLong_AsVoidPtr(args[5]);
  long threads = PyLong_AsLong(args[6]);
  if (PyErr_Occurred()) return NULL;
  if (fn == NULL || n < 1 || n > MAX_BUFFERS) {
    PyErr_SetString(PyExc_ValueError, "no kernel, or no buffers, or too many");
    return NULL;
  }
  Py_buffer views[MAX_BUFFERS];
  void *pointers[MAX_BUFFERS];
  Py_ssize_t got = 0;
  for (; got < n; ++got) {
    int flags = got == n - 1 ? PyBUF_RECORDS : PyBUF_RECORDS_RO;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, got), &views[got], flags) != 0) break;
    pointers[got] = views[got].buf;
  }
  int32_t error = 0;
  if (got == n) {
    Py_BEGIN_ALLOW_THREADS
    fn(pointers, ints, doubles, integers, fills, (int)threads, &error);
    Py_END_ALLOW_THREADS
  }
  for (Py_ssize_t i = 0; i < got; ++i) PyBuffer_Release(&views[i]);
  if (got != n) return NULL;
  return PyLong_FromLong(error);
}

static PyMethodDef methods[] = {
  {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call a compiled kernel"},
  {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "einfuse_kernel_call", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_einfuse_kernel_call(void) { return PyModule_Create(&module); }
"""

_lock = threading.Lock()
_state = {}     # "caller": the call function, or None once it could not be had


def caller() -> Optional[Callable[..., int]]:
    """The extension's ``call``, built and loaded on first use; None where it cannot be
    (no headers, no compiler, a failed build): callers then use ctypes."""
    if "caller" in _state:
        return _state["caller"]
    with _lock:
        if "caller" not in _state:
            _state["caller"] = _load()
        return _state["caller"]


def _load() -> Optional[Callable[..., int]]:
    include = sysconfig.get_paths().get("include")
    if c_build.find_compiler() is None or not include or \
            not os.path.exists(os.path.join(include, "Python.h")):
        return None
    try:
        path = c_build.build_extension(_SOURCE, ("-I" + include,))
        loader = importlib.machinery.ExtensionFileLoader(_MODULE, path)
        spec = importlib.util.spec_from_file_location(_MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module.call
    except (EinfuseError, ImportError, OSError):
        return None
