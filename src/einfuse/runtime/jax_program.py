"""A program (or a statement's hoisted form) on JAX arrays as one differentiable
function whose reverse mode runs the program's backward (autodiff/backward.py), the one
a PyTorch caller's autograd node runs: every wanted gradient in one sweep, the shift of
a softmax left out, the backward folded to read the forward's outputs where exact
(softmax's ``P*(dP - sum(dP*P))``).  Differentiated statement by statement, a softmax
program's gradient was eight einfuse primitives (the row maximum's gradient among them,
which the shift makes zero); here it is two.

How: the statements run as the C backend's fusion groups, each one XLA custom call, and
the rest one by one as einfuse primitives (runtime/jax_groups.py), under
a ``jax.custom_jvp`` whose JVP rule runs them too, keeping what the backward reads, and
gives the output tangents as one primitive, ``einfuse_program_tangent``, linear in the
inputs' tangents and reading the forward's values the backward needs.  JAX transposes
that primitive (``jax.grad``, ``jax.vjp``) by running the backward's statements, again
by their fusion groups (the NumPy caller's groups and kernels, with their bits) and
einfuse primitives: grad of grad, ``jax.hessian`` and ``vmap(grad)`` compose
as they do through single statements.  Evaluated forward (``jax.jvp``, ``jacfwd``), the
primitive is the statements' own JVP; batched (``vmap``), that JVP batched.

Used where every statement is a ':=' statement and some input is a floating JAX array
that a transformation traces (an eager call runs the statements as they are), and where
the backward can be derived for the inputs that carry a tangent; anything else keeps
the statements' own rules.

Imported only when the caller's arrays are JAX arrays."""

from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence, Set, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .backward import Backward, backward_program
from ..errors import EinfuseError, GradientBlockedError
from .program_backward import PLANS_KEPT, BackwardRun
from .run_groups import run_statements
from ..analysis.frameworks import placeholder
from . import jax_ffi
from .jax_adapter import unliteral
from ..lang.ast import accesses
from .jax_groups import run_kernels

try:
    from jax.extend.core import Primitive
except ImportError:   # jax < 0.4.36
    from jax.core import Primitive

try:
    from jax.custom_derivatives import SymbolicZero
except ImportError:   # very old jax: tangents always instantiated
    SymbolicZero = ()


class ProgramRule:
    """The statements of one program (or hoisted form) and its outputs, with their
    backward programs by the inputs that need a gradient and the plans of those
    backwards by the shapes and dtypes of their arrays.  Hashed by identity: it is the
    tangent primitive's parameter."""

    def __init__(self, kernels: Sequence, outputs: Tuple[str, ...], options):
        self.kernels = tuple(kernels)
        self.outputs = tuple(outputs)
        self.backend = options.backend
        self.threads = options.threads        # the program's threads=, the backward's too
        self.options = {key: getattr(options, key) for key in ("pad", "bounds", "fill")
                        if getattr(options, key, None) is not None}
        if getattr(options, "ranges", None):
            self.options["ranges"] = {n: range(lo, hi) for n, (lo, hi) in options.ranges}
        self._backwards: Dict[Tuple[str, ...], Optional[Backward]] = {}
        self._plans: Dict[Tuple, BackwardRun] = {}

    def backward(self, wrt: Tuple[str, ...]) -> Optional[Backward]:
        """The backward for gradients of ``wrt``, or None where it cannot be derived
        (the statements' own rules then say what is wrong, or differentiate)."""
        if wrt not in self._backwards:
            try:
                self._backwards[wrt] = backward_program(
                    [k.statement for k in self.kernels], [k.spec for k in self.kernels],
                    self.outputs, wrt, self.options)
            except GradientBlockedError:
                raise       # (through argmax, sign... alone: the statements' own error)
            except EinfuseError:
                self._backwards[wrt] = None
        return self._backwards[wrt]

    def plan(self, wrt: Tuple[str, ...], env: Dict[str, object]) -> BackwardRun:
        """The backward of ``wrt`` planned for arrays shaped like ``env``'s."""
        key = (wrt, tuple(sorted((name, np.shape(v), str(getattr(v, "dtype", type(v))))
                                 for name, v in env.items())))
        found = self._plans.get(key)
        if found is None:
            shapes = {name: placeholder(value) for name, value in env.items()}
            found = BackwardRun(self.backward(wrt), shapes, self.backend, (), "jax",
                                threads=self.threads, run_kernels=run_kernels)
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = found
        return found

    def run(self, env: Dict[str, object], keep: Optional[Set[str]] = None
            ) -> Dict[str, object]:
        """``env`` with every statement's result, each statement an einfuse primitive;
        ``keep``: the names needed afterwards (None: all), which lets the fusion
        groups of runtime/jax_groups.py run them (the rest as rows of their kernel)."""
        # (a weakly typed number traced by a transformation may come as JAX's literal)
        env = {name: unliteral(value) for name, value in env.items()}
        if keep is None:
            run_statements(self.kernels, env, "jax", keep=None)
        else:       # (a gather's inputs too: _keep_gather_checks reads them)
            run_kernels(self.kernels, env, set(keep) | self.gathered_inputs)
        return env

    @functools.cached_property
    def gathered_inputs(self) -> Set[str]:
        return {name for k in self.kernels if any(t.as_index for t in k.spec.tensors)
                for name in k.spec.arg_order}


def recorded(holder, kernels: Sequence, env: Dict[str, object], outputs: Sequence[str],
             options) -> Optional[Tuple]:
    """The outputs of ``kernels`` on ``env`` (JAX arrays, and Python numbers) as a
    differentiable function of its JAX arrays whose reverse mode runs the program's
    backward; None where the statements run with their own rules.  ``holder`` (a
    Program, a HoistedForm) keeps the derived backwards across calls."""
    if any(k.spec.assign != ":=" for k in kernels):
        return None
    # nested lists of numbers are arrays (as the statements read them): JAX arrays here,
    # since the other values are the tangent primitive's parameters, which JAX hashes
    env = {name: _listed(value) for name, value in env.items()}
    arrays = tuple(name for name, value in env.items()
                   if isinstance(value, (jax.Array, jax.core.Tracer)))
    if not any(_inexact(env[name]) for name in arrays) or \
            not any(isinstance(env[name], jax.core.Tracer) for name in arrays):
        return None     # (no tracer: an eager call, which nothing differentiates)
    rules = holder.__dict__.setdefault("_jax_rules", {})
    rule = rules.get(id(kernels))
    if rule is None:
        rule = rules[id(kernels)] = ProgramRule(kernels, tuple(outputs), options)
    constants = tuple((name, value) for name, value in env.items() if name not in arrays)
    try:
        hash(constants)
    except TypeError:       # not a number nor an array: the statements say what it is
        return None
    function = _differentiable(rule, arrays, constants)
    return function(*[env[name] for name in arrays])


def _listed(value):
    """A (nested) list or tuple of numbers as a JAX array; anything else as it is (a
    ragged list too: the statements report it)."""
    if isinstance(value, (list, tuple)):
        try:
            return jnp.asarray(value)
        except (TypeError, ValueError):
            return value
    return value


def _differentiable(rule: ProgramRule, names: Tuple[str, ...], constants: Tuple):
    """The program as a function of the arrays ``names`` (``constants``: the Python
    numbers, fixed), with the JVP rule described in the module docstring."""
    def run(*values):
        env = rule.run(dict(constants, **dict(zip(names, values))), set(rule.outputs))
        return tuple(env[name] for name in rule.outputs)

    function = jax.custom_jvp(run)

    def jvp(primals, tangents):
        # jax.jvp hands a Python number it was given as a primal to this rule as it is
        # (no dtype): a weakly typed JAX scalar, as a traced one would be
        primals = tuple(jnp.asarray(p) if isinstance(p, (int, float, complex)) else p
                        for p in primals)
        live = tuple(name for name, value, tangent in zip(names, primals, tangents)
                     if not isinstance(tangent, SymbolicZero) and _inexact(value))
        backward = rule.backward(live) if live else None
        if backward is None:        # the statements' own JVP (and transpose) rules
            return jax.jvp(run, primals, tuple(_instantiated(t, p) for t, p in
                                                  zip(tangents, primals)))
        read = backward.reads | backward.shaped | set(rule.outputs) | set(names)
        env = rule.run(dict(constants, **dict(zip(names, primals))), read)
        _keep_gather_checks(rule, env)
        outputs = tuple(env[name] for name in rule.outputs)
        fixed = {name for name, _ in constants}
        residuals = tuple(name for name in env if name in read and name not in fixed)
        flowing = [t for name, t in zip(names, tangents) if name in live]
        found = iter(tangent_p.bind(
            *[env[name] for name in residuals], *flowing, rule=rule, residuals=residuals,
            live=live, constants=constants, inputs=names))
        return outputs, tuple(next(found) if _inexact(out) else _float0(out)
                              for out in outputs)

    function.defjvp(jvp, **({"symbolic_zeros": True} if SymbolicZero != () else {}))
    return function


# the output of a gather's bounds check (a name no statement can write: leading '_')
CHECK_OUTPUT = "_bounds_check"


def _keep_gather_checks(rule: ProgramRule, env: Dict[str, object]) -> None:
    """Under jit, a gather that checks its index values under bounds='check' keeps that
    check where jax.grad needs none of its statement's values (a cross-entropy's
    ``X[i, t[i]]``: the loss itself is not a residual), which XLA would drop with the
    statement, the only reader of the labels: a label out of range would then pass
    silently into the backward.  Each such gathered read is checked by a call of its
    own, ``_bounds_check[i] := X[i, t[i]]`` (one element per row), that XLA keeps; its
    error is the statement's out-of-bounds message (naming t, its value and X's
    axis)."""
    if not any(isinstance(v, jax.core.Tracer) for v in env.values()):
        return      # (eager: the statements ran here and raised already)
    for kernel in rule.kernels:
        if kernel.options.bounds != "check":
            continue
        for access in accesses(kernel.spec.rhs):
            if not any(sub.gathers for sub in access.indices):
                continue
            free = list(dict.fromkeys(n for sub in access.indices for n in _names_in(sub)))
            if not free:
                continue
            text = f"{CHECK_OUTPUT}[{', '.join(free)}] := {access}"
            try:
                check = jax_ffi.jax_kernel(text, kernel.options)
                names = tuple(check.spec.arg_order)
                values = [jnp.asarray(env[name]) for name in names]
                _, plan = jax_ffi.cpu_route(check, names, values)
            except (EinfuseError, KeyError):
                continue        # (the statement's own call checks, where it runs)
            if isinstance(plan, jax_ffi.FfiPlan) and plan.verify:
                plan.emit(values, kept=True)


def _names_in(sub):
    """The loop indices a subscript reads, its gathers' subscripts' included."""
    yield from sub.index_names
    for gathered, _ in sub.gathers:
        for inner in gathered.indices:
            yield from _names_in(inner)


def _inexact(value) -> bool:
    return jnp.issubdtype(value.dtype, jnp.inexact)


def _float0(value):
    return np.zeros(np.shape(value), dtype=jax.dtypes.float0)


def _instantiated(tangent, primal):
    if isinstance(tangent, SymbolicZero):
        return jnp.zeros(np.shape(primal), primal.dtype) if _inexact(primal) else \
            _float0(primal)
    return tangent


# -- the tangent primitive -----------------------------------------------------------------
tangent_p = Primitive("einfuse_program_tangent")
tangent_p.multiple_results = True


def _split(operands, residuals, live):
    count = len(residuals)
    return dict(zip(residuals, operands[:count])), operands[count:]


def _forward_tangents(*operands, rule, residuals, live, constants, inputs):
    """The outputs' tangents by the statements' own JVP rules (forward mode)."""
    env, flowing = _split(operands, residuals, live)
    fixed = dict(constants, **{name: env[name] for name in inputs})

    def outputs_of(*values):
        found = rule.run(dict(fixed, **dict(zip(live, values))))
        return tuple(found[name] for name in rule.outputs if _inexact(found[name]))
    return list(jax.jvp(outputs_of, tuple(env[name] for name in live), tuple(flowing))[1])


def _abstract(*avals, rule, residuals, live, constants, inputs):
    env, _ = _split(avals, residuals, live)
    return [jax.core.ShapedArray(env[name].shape, env[name].dtype)
            for name in rule.outputs if _inexact(env[name])]


def _transpose(cotangents, *operands, rule, residuals, live, constants, inputs):
    """The inputs' cotangents by the program's backward: its statements, each an
    einfuse primitive again."""
    env, _ = _split(operands, residuals, live)
    env = {name: unliteral(value) for name, value in env.items()}
    env.update(constants)
    backward = rule.backward(live)
    flowing = iter(cotangents)
    for name, seed in zip(backward.outputs, backward.seeds):
        value = env[name]
        if not _inexact(value):
            env[seed] = jnp.zeros(np.shape(value), jnp.float32)
            continue
        cotangent = next(flowing)
        env[seed] = jnp.zeros(np.shape(value), value.dtype) if type(cotangent) is ad.Zero \
            else cotangent
    found = rule.plan(live, env)(env)
    result = []
    for name in live:
        like = env[name]
        value = found.get(name)
        # np.shape: a weakly typed Python number differentiated eagerly reaches here as
        # JAX's literal (a float subclass with a dtype but no shape)
        result.append(None if value is None else
                      jnp.asarray(value).astype(like.dtype).reshape(np.shape(like)))
    return [None] * len(residuals) + result


def _batch(values, dims, **params):
    moved = [v if d is None else jnp.moveaxis(v, d, 0) for v, d in zip(values, dims)]
    axes = [None if d is None else 0 for d in dims]
    out = jax.vmap(functools.partial(_forward_tangents, **params), in_axes=axes)(*moved)
    return out, [0] * len(out)


tangent_p.def_impl(_forward_tangents)
tangent_p.def_abstract_eval(_abstract)
ad.primitive_transposes[tangent_p] = _transpose
batching.primitive_batchers[tangent_p] = _batch
mlir.register_lowering(tangent_p, mlir.lower_fun(_forward_tangents, multiple_results=True))


__all__ = ["ProgramRule", "recorded"]
