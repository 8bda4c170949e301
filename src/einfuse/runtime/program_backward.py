"""Running a program's backward (autodiff/backward.py) on NumPy arrays, fused.

For each signature of the arrays (names, shapes, dtypes) the steps are resolved once
into a plan: runs of gather statements and Totals become compiled kernels that
schedule/fusion.py runs as one loop over rows where it can (softmax's ``de`` then
lives as one row per thread and never reaches memory); scatter statements, and Totals
that cannot be a kernel, add with NumPy between those runs (a scatter that gathers its
positions, as cross-entropy's ``dX[i, t[i]] += -dl[i]``, is prepared once:
runtime/program_scatter.py)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

import numpy as np

from ..autodiff.attribution import gradient_errors
from .backward import Backward
from .backward_steps import Total
from .backward_fold import Combined, Folded, exact_ranges
from .gradient_reference import gradient_kernel, run_reference, statements_to_run, text_kernel
from ..errors import EinfuseError
from ..lang.ast import Access, IndexExpr, sum_tree
from ..lang.printer import format_expr
from ..analysis.frameworks import JAX, TORCH, framework_of, placeholder
from .run_groups import RowLaunches, run_statements
from .program_scatter import check_labels, prepared_scatter, where_form
from .program_shared import Entry, shared_kernels
from .kernel_maker import compile_statement
from .gradient_reference import resolve_options
from .kernel_maker import new_kernel


@dataclass(frozen=True)
class _Kernels:
    """Kernels run in order by the scheduler; ``keep``: their outputs read afterwards."""
    kernels: Tuple
    keep: FrozenSet[str]
    runs: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class _Scatter:
    """Statements (scatters, or a gather's fallback scatters) whose sum is ``key``."""
    statements: Tuple
    key: str
    like: str


@dataclass(frozen=True)
class _Sum:
    total: Total


@dataclass(frozen=True)
class _Labels:
    """The range checks of scatters that run as gathers (program_scatter.WhereForm),
    per scatter statement: they hold before the kernels run, or the statement's own
    out-of-bounds error is raised."""
    checks: Tuple[Tuple[object, Tuple[Tuple[str, int, int], ...]], ...]


_Piece = Union[_Kernels, _Scatter, _Sum, _Labels]

class Count:
    """How many times a step ran: the derivations of program backwards
    (program_autograd.py) and their plans, which a repeated call must not repeat (the
    tests count them)."""

    def __init__(self) -> None:
        self.value = 0

    def add(self) -> None:
        self.value += 1


PLANS_MADE = Count()        # BackwardRuns planned

# Planned backwards kept per recorded call signature (one per layout of the seeds); a
# new layout past this replaces the oldest.
PLANS_KEPT = 16


class BackwardRun:
    """A program's backward planned for arrays like ``env``: the forward's inputs and
    the intermediates the backward reads (arrays of ``framework`` and Python scalars)
    but those that ``recompute`` (forward kernels) computes again, first, in the
    backward's first kernel, and one seed per output.  On NumPy arrays each run of
    kernels keeps the prepared run of the first call's layouts, so that a repeated
    backward is its kernel calls; JAX values (traced, runtime/jax_program.py) run the
    kernels one by one as einfuse primitives.  Calling it on arrays of the same names,
    shapes and dtypes returns {wrt: gradient} for those with one."""

    def __init__(self, backward: Backward, env: Mapping[str, object], backend: str,
                 recompute: Tuple = (), framework: str = "numpy",
                 threads: Optional[int] = None, run_kernels=None):
        PLANS_MADE.add()
        # (kernels, env, keep) -> None: how a JAX caller's runs of kernels run
        # (runtime/jax_groups.py: fusion groups as custom calls); None: run_statements
        self._run_kernels = run_kernels
        self.pieces = tuple(_with_threads(piece, threads)
                            for piece in _plan(backward, env, backend, recompute, framework))
        self.results = tuple((name, result) for name, result in
                             zip(backward.wrt, backward.results) if result is not None)
        self.framework = framework
        # per piece, how it runs: a run of kernels starts the full way (and then
        # keeps its prepared run), scatters and sums as they are
        self._runs = [self._run_of(n, piece, backend) for n, piece in enumerate(self.pieces)]

    def _run_of(self, number: int, piece: "_Piece", backend: str):
        if isinstance(piece, _Kernels):
            return self._first(number, piece)
        if isinstance(piece, _Scatter):
            return _ScatterRun(piece, backend) if self.framework != "jax" else \
                functools.partial(_scatter, piece)
        if isinstance(piece, _Labels):
            return functools.partial(_check_labels, piece)
        return functools.partial(_add, piece.total)

    def _first(self, number: int, piece: "_Kernels"):
        framework = self.framework
        if self._run_kernels is not None:
            return lambda env: self._run_kernels(piece.kernels, env, set(piece.keep))

        def run(env):
            prepared = run_statements(piece.kernels, env, framework, keep=set(piece.keep),
                                      runs=piece.runs if framework != "jax" else None)
            if prepared is not None:
                self._runs[number] = prepared
        return run

    def __call__(self, env: Dict[str, object]) -> Dict[str, object]:
        for run in self._runs:
            run(env)
        return {name: env[result] for name, result in self.results}

    def row_launches(self) -> Optional[RowLaunches]:
        """After a first run: the backward as its row groups' runners alone, where its
        every piece is a run of Triton row groups (run_groups.RowLaunches), else None.
        Called on ``env``, it writes the results (``results``' names) into it."""
        return RowLaunches.of(self._runs)


def _with_threads(piece: "_Piece", threads: Optional[int]) -> "_Piece":
    """A run of kernels on the forward's ``threads=`` (the gradient statements are
    compiled without it; a caller who fixed the threads of the forward fixed them for
    the whole computation, column sums' last bits included)."""
    if threads is None or not isinstance(piece, _Kernels):
        return piece
    kernels = tuple(k if k.options.threads == threads else
                    new_kernel(k.statement, dataclasses.replace(k.options, threads=threads))
                    for k in piece.kernels)
    return _Kernels(kernels, piece.keep)


def _check_labels(piece: _Labels, env) -> None:
    for statement, checks in piece.checks:
        check_labels(statement, checks, env)


def _add(total: Total, env) -> None:
    value = env[total.parts[0]]
    for part in total.parts[1:]:
        value = value + env[part]
    env[total.target] = value


class _ScatterRun:
    """A scatter piece's run: prepared once for the first call's layouts where
    runtime/program_scatter.py applies (then a call is the values kernel and one
    compiled add), else, and for any call it declines, the general path."""

    def __init__(self, piece: "_Scatter", backend: str):
        self.piece = piece
        self.backend = backend
        self.prepared = None        # None: not tried yet; False: does not apply

    def __call__(self, env) -> None:
        if self.prepared is None:
            self.prepared = prepared_scatter(self.piece.statements, self.piece.key, env,
                                             self.backend) or False
        if not (self.prepared and self.prepared(env)):
            _scatter(self.piece, env)


def _scatter(piece: "_Scatter", env) -> None:
    found = run_reference(list(piece.statements), env).get(piece.key)
    if found is None:       # nothing scattered: zeros, in the framework of the values
        like = env[piece.like]
        found = np.zeros(np.shape(like), _dtype(like))
        if framework_of(like) == JAX:
            import jax.numpy as jnp
            found = jnp.asarray(found)
        elif framework_of(like) == TORCH:      # (on the values' device)
            import torch
            found = torch.from_numpy(found).to(like.device)
    env[piece.key] = found


def output_placeholder(kernel, shapes: Mapping[str, object]) -> np.ndarray:
    """A placeholder of the output ``kernel`` gives for arrays like ``shapes`` (the
    placeholders of what it reads): its shape and result dtype, from binding alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call = kernel.bind(arrays={n: shapes[n] for n in kernel.spec.arg_order})
    return np.broadcast_to(np.zeros((), call.dtypes.result), call.output_shape)


def _plan(backward: Backward, env: Mapping[str, object], backend: str,
          recompute: Tuple, framework: str = "numpy") -> List[_Piece]:
    shapes = {name: placeholder(value) for name, value in env.items()}
    for kernel in recompute:
        shapes[kernel.spec.output] = output_placeholder(kernel, shapes)
    if backward.folded is not None:
        found = folded_entries(backward.folded, shapes, backend)
        if found is not None:
            entries, shapes_after = found
            needed = [k for k in recompute if k.spec.output in backward.folded.reads]
            return _plan_steps(backward, backward.folded.steps, shapes_after, backend,
                               needed, entries, framework)
    return _plan_steps(backward, backward.steps, dict(shapes), backend, recompute, {},
                       framework)


def _plan_steps(backward: Backward, steps, shapes, backend: str, recompute: Tuple,
                entries: Dict[str, Entry], framework: str = "numpy") -> List[_Piece]:
    """The plan of ``steps``; ``entries``: the kernels of folded steps by key.  On NumPy
    arrays and torch tensors (the Triton backward) a scatter that adds one value per
    position of its target runs as the gather it equals (program_scatter.where_form),
    after one check of its labels."""
    pieces: List[_Piece] = []
    checks = []                        # (scatter statement, its labels' checks)
    run: List[Entry] = [Entry(kernel, definition=True) for kernel in recompute]

    def close():
        if run:
            pieces.append(_Kernels(shared_kernels(run, shapes, backend, backward.taken),
                                   frozenset()))
            run.clear()
    for step in steps:
        if isinstance(step, Combined):
            run.append(entries[step.key])
            shapes[step.key] = np.broadcast_to(np.zeros((), _dtype(shapes[step.like])),
                                               step.shape(shapes))
            continue
        if isinstance(step, Total):
            kernel = _total_kernel(step, shapes, backward.index_names, backend)
            if kernel is None:
                close()
                pieces.append(_Sum(step))
            else:
                run.append(Entry(kernel))
            shapes[step.target] = shapes[step.parts[0]]
            continue
        chosen = statements_to_run([step.statement], shapes)
        if len(chosen) == 1 and chosen[0].kind == "gather":
            with gradient_errors(chosen[0]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                options = resolve_options(chosen[0], shapes)
                run.append(Entry(gradient_kernel(chosen[0], shapes, backend),
                                 chosen[0].text, options))
        else:
            form = where_form(chosen[0], shapes, backward.taken, backend) \
                if framework in ("numpy", "torch") and len(chosen) == 1 else None
            if form is not None:
                checks.append((chosen[0], form.checks))
                run.append(Entry(form.kernel, form.text, form.options))
            else:
                close()
                pieces.append(_Scatter(tuple(chosen), step.key, step.like))
        like = shapes[step.like]
        shapes[step.key] = np.broadcast_to(np.zeros((), _dtype(like)), np.shape(like))
    close()
    if checks:           # the labels are forward values: checked before anything runs
        pieces.insert(0, _Labels(tuple(checks)))
    return _with_keep(pieces, backward)


def folded_entries(folded: Folded, shapes: Dict[str, object], backend: str
                    ) -> Optional[Tuple[Dict[str, Entry], Dict[str, object]]]:
    """The kernels of the folded steps by key, and the shapes with a placeholder for
    every gradient name of the backward as derived (the parts' ranges may name them);
    None where folding is not exact for these arrays (autodiff/backward_fold.py)."""
    shapes = dict(shapes)
    for key, like in folded.placeholders:
        if key not in shapes and like in shapes:
            shapes[key] = np.broadcast_to(np.zeros((), _dtype(shapes[like])),
                                          np.shape(shapes[like]))
    entries: Dict[str, Entry] = {}
    for step in folded.steps:
        if not isinstance(step, Combined):
            continue
        ranges = exact_ranges(step, shapes)
        if ranges is None:
            return None
        options = {"ranges": ranges}
        try:
            kernel = text_kernel(step.text, options, backend)
        except EinfuseError:
            return None
        entries[step.key] = Entry(kernel, step.text, options)
        shapes[step.key] = np.broadcast_to(np.zeros((), _dtype(shapes[step.like])),
                                           step.shape(shapes))
    return entries, shapes


def _dtype(value) -> np.dtype:
    dtype = np.dtype(getattr(value, "dtype", np.float64))
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def _total_kernel(total: Total, shapes, index_names: Tuple[str, ...], backend: str):
    """``target[a...] := p1[a...] + p2[a...]``, or None (a 0-d gradient, parts of
    different shapes or dtypes, or more axes than free index names)."""
    first = shapes[total.parts[0]]
    rank = np.ndim(first)
    if rank == 0 or rank > len(index_names) or any(
            np.shape(shapes[p]) != np.shape(first) or
            getattr(shapes[p], "dtype", None) != getattr(first, "dtype", None)
            for p in total.parts):
        return None
    subscript = f"[{', '.join(index_names[:rank])}]"
    terms = [Access(p, tuple(IndexExpr(((i, 1),)) for i in index_names[:rank]))
             for p in total.parts]
    text = f"{total.target}{subscript} := {format_expr(sum_tree(terms))}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_statement(text, backend=backend)


def _with_keep(pieces: List[_Piece], backward: Backward) -> List[_Piece]:
    """Each run of kernels keeps the outputs that a later piece or the caller reads."""
    needed = {name for name in backward.results if name is not None}
    result: List[_Piece] = []
    for piece in reversed(pieces):
        if isinstance(piece, _Kernels):
            result.append(_Kernels(piece.kernels, frozenset(needed)))
            for kernel in piece.kernels:
                needed |= set(kernel.spec.arg_order)
        elif isinstance(piece, _Scatter):
            result.append(piece)
            needed |= {n for g in piece.statements for n in g.inputs} | {piece.like}
        elif isinstance(piece, _Labels):
            result.append(piece)
            needed |= {name for _, found in piece.checks for name, _, _ in found}
        else:
            result.append(piece)
            needed |= set(piece.total.parts)
    return list(reversed(result))
