"""JAX integration: a statement on JAX arrays is one JAX primitive, ``einfuse``, whose
parameters are the statement's text and options.  Every JAX transformation of it is
again that primitive on another statement, so transformations compose to any depth:

* jit: on the CPU the primitive lowers to the C kernel as an XLA FFI custom call, or
  to an XLA dot for a contraction (:mod:`einfuse.runtime.jax_ffi`), else to a
  ``jax.pure_callback`` running einfuse on the host; on a GPU with jax_triton: a
  Triton kernel (:mod:`einfuse.runtime.jax_gpu`);
* jvp (``jax.jvp``, ``jax.jacfwd``): the tangent statement
  (:func:`einfuse.autodiff.forward.tangent`), linear in the inputs' tangents;
* transpose (reverse mode: ``jax.grad``, ``jax.vjp``, which linearize and transpose):
  the tangent is a primitive of its own, ``einfuse_jvp``, whose transpose runs the
  statement's gradient statements (``ef.derive``), the ones PyTorch runs too;
* vmap: the statement with one more index, on the output and on each batched input
  only (an unbatched input is not copied per batch element).

So ``jax.grad(jax.grad(f))``, ``jax.hessian`` (forward over reverse), ``jax.jvp`` and
``jax.vmap(jax.grad(f))`` all work, with and without jit.

The host callback remains the fallback: it runs anything einfuse runs (the NumPy
reference, Triton under the interpreter, statements the FFI handler cannot take).

Imported only when the caller's arrays are JAX arrays."""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from ..errors import EinfuseTypeError, NoGradientError
from ..lang import parse
from ..lang.ast import Access, Param, map_children
from ..lang.printer import format_statement
from ..lang.rewrite import batch_statement, fresh_indices
from . import gradients, jax_ffi, jax_gpu
from ..analysis.frameworks import placeholder
from ..analysis.spec import spec_of

try:
    from jax.extend.core import Primitive
except ImportError:   # jax < 0.4.36
    from jax.core import Primitive


def call(kernel, named: Dict[str, object]):
    spec = kernel.spec
    if spec.assign != ":=":
        raise EinfuseTypeError(f"'{spec.assign}' cannot write into a JAX array, which is "
                               "immutable; use ':=' and .at[].set()",
                               span=spec.statement.output_span)
    names = tuple(spec.arg_order)
    values = _jax_values(kernel, names, named)
    route = "host"
    if jax_gpu.jax_triton_installed() and jax_gpu.on_gpu(values) and \
            _device(kernel, names, values) is not None:
        route = "device"
    elif not any(isinstance(v, jax.core.Tracer) for v in values):
        # an eager call (no jit, grad or vmap): run it here, so that an error is raised
        # as itself, not wrapped in a callback's JaxRuntimeError
        return jnp.asarray(kernel.run(kernel.bind(**dict(zip(names, values)))))
    return einfuse_p.bind(*values, statement=kernel.statement, options=kernel.options,
                          names=names, route=route)


def _is_weak(value) -> bool:
    """A Python number, or a 0-d JAX value of weak type (how jax.jit traces one)."""
    if isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, (jax.Array, jax.core.Tracer)) and np.ndim(value) == 0:
        aval = jax.typeof(value) if hasattr(jax, "typeof") else jax.core.get_aval(value)
        return bool(getattr(aval, "weak_type", False))
    return False


def stand_in(kernel, name: str, value):
    """What binding reads of ``value`` for the statement's ``name``: a placeholder of its
    shape and dtype, but a Python number of its kind for a scalar parameter of weak
    type (traced from a Python number), which promotes weakly as the number does
    (``float32 * 2.5`` stays float32) where a placeholder's float64 would not."""
    if name in kernel.spec.params and _is_weak(value) and \
            not isinstance(value, (bool, int, float)):
        return {"b": False, "f": 0.0}.get(np.dtype(value.dtype).kind, 0)
    return placeholder(value)


def _jax_values(kernel, names, named) -> tuple:
    """The inputs as JAX arrays.  A scalar parameter given as a Python number (or traced
    from one) promotes weakly, as on NumPy arrays and in jax.numpy (``float32 * 2.5``
    stays float32): ``jnp.asarray`` alone would make it a strong float64 or int32, so it
    is cast to the working dtype that the statement has with the number itself."""
    for name in names:      # a ragged list: an error naming it, not JAX's ValueError
        if isinstance(named[name], (list, tuple)):
            try:
                jnp.asarray(named[name])
            except (TypeError, ValueError) as error:
                raise EinfuseTypeError(
                    f"{name} cannot be read as an array ({error}); pass an array or a "
                    "nested list of numbers of one shape") from None
    weak = {n for n in kernel.spec.params if _is_weak(named[n])}
    if not weak:
        return tuple(jnp.asarray(named[name]) for name in names)
    stand_ins = {}
    for name in names:
        value = named[name]
        if name in weak and not isinstance(value, (bool, int, float)):
            value = {"b": False, "f": 0.0}.get(np.dtype(value.dtype).kind, 0)  # kind only
        stand_ins[name] = placeholder(value)
    working = jax.dtypes.canonicalize_dtype(kernel.bind(**stand_ins).dtypes.working)
    return tuple(jnp.asarray(named[name], dtype=working) if name in weak
                 else jnp.asarray(named[name]) for name in names)


def _struct(kernel, names, values) -> jax.ShapeDtypeStruct:
    """Shape and dtype of the result, from the inputs' shapes and dtypes alone."""
    bound = kernel.bind(**{name: placeholder(v) for name, v in zip(names, values)})
    dtype = jax.dtypes.canonicalize_dtype(bound.dtypes.result)
    return jax.ShapeDtypeStruct(bound.output_shape, dtype)


def _device(kernel, names, values):
    """The Triton launch for these shapes and dtypes, or None for the host path."""
    key = tuple((tuple(np.shape(v)), np.dtype(v.dtype).name) for v in values)
    return _device_for(kernel.statement, kernel.options, tuple(names), key)


@functools.lru_cache(maxsize=256)
def _device_for(statement, options, names, key):
    shapes = [np.broadcast_to(np.zeros((), dtype), shape) for shape, dtype in key]
    return jax_gpu.device_call(jax_ffi.jax_kernel(statement, options), names, shapes)


# -- the primitive ------------------------------------------------------------------------
einfuse_p = Primitive("einfuse")


def _abstract(*avals, statement, options, names, route):
    struct = _struct(jax_ffi.jax_kernel(statement, options), names, avals)
    return jax.core.ShapedArray(struct.shape, struct.dtype)


def unliteral(value):
    """``value``, or a JAX array of it where it is one of JAX's literals: a weakly typed
    0-d value that JAX hands to a primitive's impl, or to a custom_jvp rule evaluated
    eagerly, as a Python number subclass with a dtype but no shape (``TypedFloat``),
    which binding would take for an array and fail to read the shape of."""
    if isinstance(value, (int, float, complex)) and \
            type(value).__module__.startswith("jax"):
        return jnp.asarray(value)
    return value


def _impl(*values, statement, options, names, route):
    values = tuple(unliteral(v) for v in values)
    if route == "device":   # compiled through the lowering below, as under jit
        return _jitted(statement, options, names, route)(*values)
    kernel = jax_ffi.jax_kernel(statement, options)
    return jnp.asarray(kernel.run(kernel.bind(**dict(zip(names, values)))))


@functools.lru_cache(maxsize=256)
def _jitted(statement, options, names, route):
    return jax.jit(functools.partial(einfuse_p.bind, statement=statement, options=options,
                                     names=names, route=route))


def _lower(*values, statement, options, names, route, cpu=False):
    kernel = jax_ffi.jax_kernel(statement, options)
    struct = _struct(kernel, names, values)
    if route == "device" and (not cpu or jax_gpu.launches_in_cpu_lowering()):
        device = _device(kernel, names, values)
        if device is not None:   # None: the batched statement's kernel takes the host
            out = jax_gpu.launch_kernel(device, jax_gpu.kernel_inputs(
                device, dict(zip(names, values))))
            return out if out.dtype == struct.dtype else out.astype(struct.dtype)
    planned = jax_ffi.cpu_route(kernel, names, values)[1] if cpu else None
    if planned is not None:   # inside XLA: the C kernel, or a dot (runtime/jax_ffi.py)
        out = planned.emit(values)
        return out if out.dtype == struct.dtype else out.astype(struct.dtype)

    def run_host(*arrays):
        result = kernel(**dict(zip(names, (np.asarray(a) for a in arrays))))
        return np.asarray(result, dtype=struct.dtype)
    from .jax_host_callback import host_callback   # not pure_callback: see that module
    return host_callback(run_host, struct, *values)


def _transpose(cotangent, *args, statement, options, names, route):
    """A statement linear in its undefined inputs (JAX transposes only linear
    functions): their cotangents are its gradient statements.  An undefined input is
    only a shape and a dtype, which is all that those statements need of it."""
    wanted = [n for n, a in zip(names, args) if ad.is_undefined_primal(a)]
    arrays = {n: jax.ShapeDtypeStruct(a.aval.shape, a.aval.dtype)
              if ad.is_undefined_primal(a) else a for n, a in zip(names, args)}
    found = _cotangents(cotangent, arrays, wanted, statement, options)
    return [found.get(n) for n in names]


def _cotangents(cotangent, arrays, wanted, statement, options) -> Dict[str, object]:
    """{name: cotangent} for the ``wanted`` inputs: ``statement``'s gradient statements,
    run as primitives again (so that they can be differentiated in turn)."""
    if type(cotangent) is ad.Zero or not wanted:
        return {}
    from . import jax_scatter_grad
    if jax_scatter_grad.scatters(statement, options, wanted):
        # a gather's gradient: the values and the scatter-add as one compiled kernel
        fused = jax_scatter_grad.fused_cotangents(cotangent, arrays, wanted, statement,
                                                  options)
        if fused is not None:
            return fused
    found = gradients.compute_gradients(statement, options, arrays, cotangent, wanted)
    return {n: jnp.asarray(found[n]).astype(arrays[n].dtype).reshape(np.shape(arrays[n]))
            for n in wanted}


def _batch(values, dims, *, statement, options, names, route):
    """vmap: the batch axis first on each batched input, and the statement with one
    more index on the output and on those inputs."""
    moved = [v if d is None else jnp.moveaxis(v, d, 0) for v, d in zip(values, dims)]
    batched = tuple(n for n, d in zip(names, dims) if d is not None)
    text = _batched_for(statement, batched, len(names))
    return einfuse_p.bind(*moved, statement=text, options=options, names=names,
                          route=route), 0


einfuse_p.def_abstract_eval(_abstract)
einfuse_p.def_impl(_impl)
mlir.register_lowering(einfuse_p, mlir.lower_fun(_lower, multiple_results=False))
mlir.register_lowering(einfuse_p, mlir.lower_fun(functools.partial(_lower, cpu=True),
                                                 multiple_results=False), platform="cpu")
ad.primitive_transposes[einfuse_p] = _transpose
batching.primitive_batchers[einfuse_p] = _batch


# -- forward mode -------------------------------------------------------------------------
# The tangent of ``statement`` for the inputs ``live``: its inputs are the statement's
# (in ``names`` order) and then the tangents of ``live``.  Evaluated (jax.jvp, jacfwd),
# it runs the tangent statement (autodiff.forward); transposed (reverse mode), it runs
# the statement's own gradient statements, so that jax.grad needs no forward mode and
# runs exactly ``ef.derive``'s statements.
einfuse_jvp_p = Primitive("einfuse_jvp")


def _jvp(primals, tangents, *, statement, options, names, route):
    out = einfuse_p.bind(*primals, statement=statement, options=options, names=names,
                         route=route)
    spec = jax_ffi.jax_kernel(statement, options).spec
    readable = {t.name for t in spec.tensors if t.as_value} | set(spec.params)
    live = tuple(n for n, p, t in zip(names, primals, tangents)
                 if type(t) is not ad.Zero and n in readable and
                 jnp.issubdtype(p.dtype, jnp.inexact))
    if live and jnp.issubdtype(out.dtype, jnp.inexact):
        try:
            found = _tangent(statement, live, options)
        except NoGradientError:   # raised if the tangent itself is asked for; reverse
            found = True          # mode runs ef.derive's statements, which can do it
        if found is not None:
            moving = [t for n, t in zip(names, tangents) if n in live]
            return out, einfuse_jvp_p.bind(*primals, *moving, statement=statement,
                                           options=options, names=names, live=live,
                                           route=route)
    # the result does not change with the inputs that do (comparisons, floor, ...)
    dtype = out.dtype if jnp.issubdtype(out.dtype, jnp.inexact) else jax.dtypes.float0
    return out, ad.Zero(jax.core.ShapedArray(out.shape, dtype))


def _tangent(statement, live, options):
    return gradients.tangent_statement(statement, live, gradients.options_key(options))


def _tangent_form(statement, options, names, live):
    """The tangent statement's kernel, and where each of its inputs is among
    einfuse_jvp's (the statement's inputs, then the tangents)."""
    found = _tangent(statement, live, options)
    ranges = tuple((k, (r.start, r.stop)) for k, r in found.options.get("ranges", {}).items())
    kernel = jax_ffi.jax_kernel(found.text, dataclasses.replace(options, ranges=ranges))
    position = {n: k for k, n in enumerate(names)}
    position.update((found.tangents[n], len(names) + k) for k, n in enumerate(live))
    return kernel, [position[n] for n in kernel.spec.arg_order]


def _jvp_abstract(*avals, statement, options, names, live, route):
    return _abstract(*avals[:len(names)], statement=statement, options=options,
                     names=names, route=route)


def _jvp_value(*values, statement, options, names, live, route):
    """The tangent itself (its impl and its lowering): the tangent statement's value."""
    out = _jvp_abstract(*values, statement=statement, options=options, names=names,
                        live=live, route=route)
    kernel, where = _tangent_form(statement, options, names, live)
    inputs = dict(zip(kernel.spec.arg_order, (values[k] for k in where)))
    return jnp.asarray(kernel(**inputs)).astype(out.dtype)


def _jvp_transpose(cotangent, *args, statement, options, names, live, route):
    """The cotangents of the tangents: the forward statement's gradient statements at
    the primal values (the tangent is linear in the tangents, never in the primals)."""
    primals, tangents = args[:len(names)], args[len(names):]
    wanted = [n for n, t in zip(live, tangents) if ad.is_undefined_primal(t)]
    found = _cotangents(cotangent, dict(zip(names, primals)), wanted, statement, options)
    return [None] * len(names) + [found.get(n) for n in live]


def _jvp_jvp(values, tangents, *, statement, options, names, live, route):
    """A tangent's own tangent: that of the tangent statement."""
    kernel, where = _tangent_form(statement, options, names, live)
    return _jvp([values[k] for k in where], [tangents[k] for k in where],
                statement=kernel.statement, options=kernel.options,
                names=kernel.spec.arg_order, route=route)


def _jvp_batch(values, dims, *, statement, options, names, live, route):
    """A batched tangent: the tangent statement, batched."""
    kernel, where = _tangent_form(statement, options, names, live)
    return _batch([values[k] for k in where], [dims[k] for k in where],
                  statement=kernel.statement, options=kernel.options,
                  names=kernel.spec.arg_order, route=route)


ad.primitive_jvps[einfuse_p] = _jvp
einfuse_jvp_p.def_abstract_eval(_jvp_abstract)
einfuse_jvp_p.def_impl(_jvp_value)
mlir.register_lowering(einfuse_jvp_p, mlir.lower_fun(_jvp_value, multiple_results=False))
ad.primitive_jvps[einfuse_jvp_p] = _jvp_jvp
ad.primitive_transposes[einfuse_jvp_p] = _jvp_transpose
batching.primitive_batchers[einfuse_jvp_p] = _jvp_batch


# -- vmap ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _batched(statement: str, levels: int) -> str:
    parsed = parse(statement)
    return format_statement(batch_statement(parsed, fresh_indices(parsed, levels)))


def _batched_for(statement: str, batched: Sequence[str], count: int) -> str:
    """``statement`` with one leading batch index on the output and on the inputs in
    ``batched``: the fully batched statement, with the other inputs read as before."""
    full = _batched(statement, 1)
    return full if len(batched) == count else _unbatch(statement, full, frozenset(batched))


@functools.lru_cache(maxsize=256)
def _unbatch(statement: str, full: str, batched: frozenset) -> str:
    params = set(spec_of(statement).params)

    def visit(expr):
        mapped = map_children(expr, visit)
        if isinstance(mapped, Access) and mapped.tensor not in batched:
            if mapped.tensor in params:   # batching made the scalar a tensor
                return Param(mapped.tensor)
            return dataclasses.replace(mapped, indices=mapped.indices[1:])
        return mapped
    parsed = parse(full)
    return format_statement(dataclasses.replace(parsed, rhs=visit(parsed.rhs)))
