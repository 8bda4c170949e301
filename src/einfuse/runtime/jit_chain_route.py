"""A function of a whole batch of chains run as its one-chain function vmapped
(runtime/jit_chains.py finds the form): the one-chain program spread over programs
and lanes as any vmapped call is (runtime/jit_triton.py's TritonRoute over the batch
level of the chains), the outputs that are sums over the chains summed after it by one
fixed-order kernel (backends/triton/jit_chain_sum.py), the chained ones stacked with
their chain axis back in place, the shared ones taken from the first chain."""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import jax
import numpy as np

from .jit_chain_kinds import drop
from .jit_chains import ChainForm
from .jit_support import vmapped_program, without_dead_code

_lock = threading.Lock()


class ChainBatch:
    """The one-chain function over the chains, as a vmapped call looks to TritonRoute:
    ``in_avals``/``out_avals`` of the batch (each output stacked over the chains),
    ``base`` the one-chain function, ``batched`` which inputs carry the chains."""

    def __init__(self, function, form: ChainForm):
        self.form = form
        self.name = f"{function.name} per chain"
        self.sizes = (form.chains,)
        self.batched = tuple((axis is not None,) for axis in form.in_axes)
        # (each chained input as the kernel takes it: its chain axis leading, arranged)
        self.in_avals = tuple(
            aval if axis in (None, 0) else jax.core.ShapedArray(
                (aval.shape[axis],) + tuple(drop(aval.shape, axis)), aval.dtype)
            for aval, axis in zip(function.in_avals, form.in_axes))
        self.closed = without_dead_code(jax.make_jaxpr(form.per_chain)(*form.examples))
        self.out_avals = tuple(jax.core.ShapedArray((form.chains,) + tuple(v.aval.shape),
                                                    v.aval.dtype)
                               for v in self.closed.jaxpr.outvars)
        from ..frontends.jaxpr import convert
        self.program = convert(self.closed)
        self.constants = [array for _, array in self.program.constants]

    def arranged(self, arrays) -> list:
        """The call's arrays as the kernel reads them: a chained input whose chain axis
        is not its first moved there (a JAX array where it lives, by an XLA transpose;
        any other through NumPy, made contiguous by the route's conversion)."""
        found = list(arrays)
        for position, axis in enumerate(self.form.in_axes):
            if axis not in (None, 0) and position < len(found):
                value = found[position]
                found[position] = jax.numpy.moveaxis(value, axis, 0) if \
                    isinstance(value, jax.Array) else np.moveaxis(np.asarray(value), axis, 0)
        return found

    def block(self, lanes: int):
        """The program of ``lanes`` chains (the one-chain function vmapped over them)
        and its constants."""
        form = self.form        # (a chained input's chain axis leads once arranged)
        return vmapped_program(form.per_chain, form.examples,
                               tuple(axis is not None for axis in form.in_axes), lanes)


class ChainOutputs:
    """Where the stacked outputs of the one-chain kernel go: those that are sums over
    the chains into one flat buffer per dtype (output after output), summed over the
    chains in chain order -- by the kernel's last program, in the same launch, where
    every dtype's columns fit one block (``in_kernel``: the kernel is rendered with
    :meth:`epilogue` and takes :meth:`kernel_arguments`), else by one ChainSum per
    dtype after it; the rest allocated on their own."""

    def __init__(self, batch: ChainBatch):
        from ..backends.triton.jit_chain_sum import IN_KERNEL_COLUMNS
        self.batch = batch
        groups: Dict[str, List[int]] = {}
        for k, kind in enumerate(batch.form.out_kinds):
            if kind.partial:
                groups.setdefault(np.dtype(batch.out_avals[k].dtype).name, []).append(k)
        self.groups = groups
        self.sizes = {dtype: [int(np.prod(batch.out_avals[k].shape[1:])) for k in members]
                      for dtype, members in groups.items()}
        self.in_kernel = bool(groups) and all(
            sum(sizes) <= IN_KERNEL_COLUMNS for sizes in self.sizes.values())
        self._sums: Dict[str, object] = {}

    @property
    def launches(self) -> int:
        """The sum kernels launched after the one-chain kernel."""
        return 0 if self.in_kernel else len(self.groups)

    def describe(self) -> str:
        if self.in_kernel:
            return "its last program summing the chains in chain order (one launch)"
        return f"then {len(self.groups)} fixed-order sum kernel(s)"

    def epilogue(self, rendered):
        """The one-chain kernel as launched: with the sums in it where ``in_kernel``."""
        if not self.in_kernel:
            return rendered
        from ..backends.triton.jit_chain_sum import with_chain_sums
        return with_chain_sums(rendered, self.batch.form.chains, list(self.sizes.values()))

    def summer(self, dtype: str):
        with _lock:
            found = self._sums.get(dtype)
            if found is None:
                from ..backends.triton.jit_chain_sum import ChainSum
                found = self._sums[dtype] = ChainSum(self.batch.form.chains,
                                                     self.sizes[dtype])
            return found

    def allocate(self, device) -> Tuple[list, list]:
        """(the kernel's output tensors, per group its dtype, flat term buffer and the
        buffer of its sums)."""
        import torch
        avals = self.batch.out_avals
        outputs: list = [None] * len(avals)
        buffers = []
        for dtype, members in self.groups.items():
            total = sum(int(np.prod(avals[k].shape)) for k in members)
            flat = torch.empty(max(1, total), dtype=getattr(torch, dtype), device=device)
            start = 0
            for k in members:
                size = int(np.prod(avals[k].shape))
                outputs[k] = flat[start:start + size].view(tuple(avals[k].shape))
                start += size
            sums = torch.empty(max(1, sum(self.sizes[dtype])), dtype=flat.dtype,
                               device=device)
            buffers.append((dtype, flat, sums))
        for k, aval in enumerate(avals):
            if outputs[k] is None:
                outputs[k] = torch.empty(tuple(aval.shape),
                                         dtype=getattr(torch, np.dtype(aval.dtype).name),
                                         device=device)
        return outputs, buffers

    def kernel_arguments(self, buffers, device) -> list:
        """What the kernel takes after its outputs and scratch where it sums (per group
        the terms and the sums' buffer, then a zero ticket), else nothing."""
        if not self.in_kernel:
            return []
        import torch
        found = [tensor for _, flat, sums in buffers for tensor in (flat, sums)]
        return found + [torch.zeros((1,), dtype=torch.int32, device=device)]

    def finish(self, outputs, buffers) -> list:
        """The batch function's outputs from the kernel's."""
        form = self.batch.form
        found: list = [None] * len(outputs)
        for (dtype, flat, result), members in zip(buffers, self.groups.values()):
            if not flat.numel() or not sum(int(np.prod(outputs[k].shape)) for k in members):
                for k in members:       # (no elements: nothing to sum, nothing to launch)
                    found[k] = outputs[k].new_zeros(tuple(outputs[k].shape[1:]))
                continue
            if not self.in_kernel:
                self.summer(dtype)(flat, result)
            start = 0
            for k, size in zip(members, self.sizes[dtype]):
                found[k] = result[start:start + size].view(tuple(outputs[k].shape[1:]))
                start += size
        for k, kind in enumerate(form.out_kinds):
            if found[k] is not None:
                continue
            if kind.chain is not None:
                found[k] = outputs[k].movedim(0, kind.chain).contiguous()
            else:
                found[k] = outputs[k][0]
        return found


__all__ = ["ChainBatch", "ChainOutputs"]
