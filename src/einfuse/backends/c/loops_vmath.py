"""``exp``, ``tanh`` and ``logistic`` (``jax.nn.sigmoid``) over a whole buffer as
explicit vector code, for the jit kernel renderer (``c_loops.py``).

Why: in a vmapped MLP step the activations are half the time (the layer's product runs
at the FMA peak already), and a ``#pragma omp simd`` loop of ``1 / (1 + exp(-x))``
calls libmvec's ``exp``, which fetches its table with a gather and saves the caller's
vector registers around each call (and ``tanh``, an RNN cell's activation, has a
libmvec variant that is slower still).  Here each function is GCC vector code of one
register's width (backends/c/vmath_source.py holds the C text and its accuracy):
measured on a loop of 256 activations, the AVX-512 logistic took 5-10% less time than
the libmvec loop in float64, 20-25% in float32.

Which width, and whether the vector code is compiled at all, plan/jit_vectors.py
decides from the machine: GCC with AVX2 (32-byte vectors) or AVX-512 (64 bytes);
elsewhere the generated ``#if`` keeps the scalar loop."""

from __future__ import annotations

import math

from ...ir import Apply, Assign, Index, Read, ScalarType
from ...plan.jit_vectors import jit_vectors
from .loops_flat import reads_only_at
from .scalar_types import C_TYPE
from .vmath_source import FUNCTIONS, function

CONDITION = "EF_VECTOR_MATH"


def _helper(op: str, dtype: ScalarType):
    """(name, C text) of the vector function, inside the #if."""
    name, text = function(op, dtype, jit_vectors().vector_bytes)
    return name, "\n".join([f"#if {CONDITION}", text, "#endif"])


def _guard() -> str:
    return "\n".join([f"#if {jit_vectors().vector_math_condition}", f"#define {CONDITION} 1",
                      "#else", f"#define {CONDITION} 0", "#endif"])


def applies(renderer, step: Assign) -> bool:
    """Whether ``step`` is ``out[i...] = f(value)`` (``f`` exp, tanh or logistic) over
    the whole of ``out`` (float32/float64), ``value`` reading whole same-shaped buffers only at the
    statement's own position, and not given threads; at least
    ``plan/jit_vectors.JitVectors.math_vectors`` vectors long (a shorter one runs
    faster through the libmvec loop)."""
    value = step.value
    if step.reduction is not None or step.prefix or not isinstance(value, Apply) or \
            value.op not in FUNCTIONS or value.dtype not in (ScalarType.FLOAT32,
                                                          ScalarType.FLOAT64):
        return False
    extents = tuple(e for _, e in step.indices)
    lanes = jit_vectors().lanes(value.dtype.numpy.itemsize)
    program = renderer.program
    target = program.buffer(step.buffer)
    if math.prod(extents) < jit_vectors().math_vectors * lanes or target.shape != extents or \
            target.dtype is not value.dtype or step.parallel:
        return False
    identity = tuple(Index(n) for n, _ in step.indices)
    return reads_only_at(value.args[0], identity, extents,
                          lambda name: program.buffer(name).shape,
                          {n for n, _ in step.indices})


def render(renderer, step: Assign) -> None:
    """The whole vectors through ``ef_v<f>_*``, the rest (and compilers without
    the vector code) through the scalar loop."""
    dtype = step.value.dtype
    t = C_TYPE[dtype]
    lanes = jit_vectors().lanes(dtype.numpy.itemsize)
    total = math.prod(e for _, e in step.indices)
    whole = total // lanes * lanes
    identity = tuple(Index(n) for n, _ in step.indices)
    shared = renderer.offset

    def offset(buffer, subscripts):
        return "ef_e" if tuple(subscripts) == identity else shared(buffer, subscripts)
    renderer.offset = offset          # reads at the flat position ef_e
    try:
        argument = renderer.expr(step.value.args[0])
        scalar = renderer.expr(step.value)
    finally:
        del renderer.offset
    renderer.helpers.setdefault(CONDITION, _guard())
    name, text = _helper(step.value.op, dtype)
    renderer.helpers.setdefault(name, text)
    renderer.emit(f"#if {CONDITION}")
    renderer.emit(f"for (long long ef_f = 0; ef_f < {whole}LL; ef_f += {lanes}LL) {{")
    source = step.value.args[0]
    if isinstance(source, Read) and argument == f"{source.buffer}[ef_e]":
        # the argument is a buffer: one vector load
        renderer.emit(f"    ef_vec_{t} ef_v; memcpy(&ef_v, &{source.buffer}[ef_f], sizeof ef_v);")
    else:
        # (GCC unrolls and vectorises this loop; "omp simd" on it cost a third)
        renderer.emit(f"    {t} ef_in[{lanes}];")
        renderer.emit(f"    for (long long ef_e = ef_f; ef_e < ef_f + {lanes}LL; ++ef_e) "
                      f"ef_in[ef_e - ef_f] = {argument};")
        renderer.emit(f"    ef_vec_{t} ef_v; memcpy(&ef_v, ef_in, sizeof ef_v);")
    renderer.emit(f"    ef_v = {name}(ef_v);")
    renderer.emit(f"    memcpy(&{step.buffer}[ef_f], &ef_v, sizeof ef_v);")
    renderer.emit("}")
    renderer.emit("#endif")
    # the scalar loop: the rest after the whole vectors, or everything without them
    renderer.emit("#pragma omp simd")
    renderer.emit(f"for (long long ef_e = {CONDITION} ? {whole}LL : 0LL; ef_e < {total}LL; "
                  "++ef_e) {")
    renderer.emit(f"    {step.buffer}[ef_e] = {scalar};")
    renderer.emit("}")
