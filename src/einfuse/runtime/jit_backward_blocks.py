"""The fused backward of a vmapped ``ef.jit`` function, run over blocks of the batch.

``jax.grad`` of ``jax.vmap(ef.jit(f))`` with a weight the batch does not map runs the
compiled backward of ``jax.vmap(f)`` (runtime/jit_compiled.vmapped_backward): one
kernel in which the weight's gradient is one sum over the batch, not one gradient per
element summed afterwards.  Over the whole batch at once, that kernel stores every
residual of every element for every step before the reversed loop reads them back:
the vmapped seed's gradient (256 chains x 2000 steps x 32 hidden, float64) allocated
4 x 131 MB a call, and the fresh pages (128,000 faults: 275 ms of system time) cost
more than the kernel's 181 ms of work; the kernel ran on one thread, however many
the call had.

Here the batch is cut into blocks of ``BLOCK`` elements: the backward of ``jax.vmap(f)``
over one block is compiled once, and run for every block inside one C call
(runtime/jit_batch.py, one block per batch element of that call, the blocks shared
among OpenMP threads, each thread reusing its own intermediates for all its blocks: 32
MB for the seed's 16 chains, which glibc then serves from its heap call after call, no
fresh pages); a last block of the remainder runs the program of its own size.  A shared weight's gradient is then one per block, summed by JAX after the
call: its sum over the batch is grouped by blocks (a rounding difference from one sum
over all elements, as any reordered sum); every other gradient is the block's own.

Blocks trade residuals for copies of the shared gradients (one per block), so they
are taken only where those copies take fewer bytes than the call's batched arguments
(primals and cotangents): the extra memory is then bounded by what the call was
handed.  The seed's 16 copies of 8.7 KB of weight gradients against 4 MB of noise,
yes; a vmapped lookup of a few tokens each into a large table, no: its batch stays
one kernel, as before."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# elements of the batch per block: the seed's gradient (256 x 2000 x 32, float64, one
# thread) took 243 ms a call at 8 (the weight's gradient summed over 8 rows a step),
# 224 at 16, 217-238 at 32 (64 MB of residuals a thread: past glibc's largest mmap
# threshold, fresh pages each call), 232 at 64
BLOCK = 16


def blocked_cotangents(function, size: int, axes: Sequence[Optional[int]], floats,
                       primals, cotangents):
    """The float inputs' cotangents of ``jax.vmap(function's fn, in_axes=axes)`` (over
    ``size`` elements), its backward run over blocks; None when the batch has fewer
    than two blocks or a block's backward does not convert.  ``primals`` carry the
    batch where ``axes`` says 0 (and only there), ``cotangents`` always."""
    block = BLOCK
    whole = size // block
    rest = size - whole * block
    if whole < 2:
        return None
    mapped = [axis == 0 for axis in axes] + [True] * len(cotangents)
    values = list(primals) + list(cotangents)
    handed = sum(int(np.prod(jnp.shape(v))) * jnp.dtype(v.dtype).itemsize
                 for v, m in zip(values, mapped) if m)
    shared = sum(int(np.prod(function.in_avals[k].shape)) * function.in_avals[k].dtype.itemsize
                 for k in floats if axes[k] is None)
    if whole * shared >= handed:
        return None
    backward = function.vmapped_backward(block, tuple(axes))
    if backward is None:
        return None
    remainder = function.vmapped_backward(rest, tuple(axes)) if rest else None
    if rest and remainder is None:
        return None
    in_blocks = [jnp.reshape(v[:whole * block], (whole, block) + tuple(v.shape[1:]))
                 if m else v for v, m in zip(values, mapped)]
    found = jax.vmap(lambda *v: tuple(backward.run(list(v))),
                 in_axes=[0 if m else None for m in mapped])(*in_blocks)
    if rest:
        last = remainder.run([v[whole * block:] if m else v for v, m in zip(values, mapped)])
    out = []
    for k, (g, input_index) in enumerate(zip(found, floats)):
        if axes[input_index] == 0:
            g = jnp.reshape(g, (whole * block,) + tuple(g.shape[2:]))
            out.append(jnp.concatenate([g, last[k]]) if rest else g)
        else:
            g = g.sum(0)
            out.append(g + last[k] if rest else g)
    return out

