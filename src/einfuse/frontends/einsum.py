"""``ef.einsum``: numpy.einsum's subscripts translated into an index-notation statement,
or, for three or more operands, into a program of pairwise contractions in the order a
contraction-path search (opt_einsum) finds.

numpy's rules, all kept: implicit output (the labels used once, sorted, after the
ellipsis axes) and explicit ``->`` output; ``...`` with broadcasting (right-aligned,
axes of length 1 stretch); a length-1 axis also stretches against a longer axis of the
same label, as numpy allows; a label repeated inside one operand takes its diagonal, and
one missing from the output is summed."""

from __future__ import annotations

import functools
import re
import string
import numpy as np
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import EinfuseSyntaxError, EinfuseTypeError, ShapeError, unexpected_keywords
from ..pictures import front_end_page, save_page

_LETTERS = set(string.ascii_letters)
# einsum's own keywords, then those of ein() it passes on (the operands are its arrays)
KEYWORDS = ("optimize", "out", "casting", "order", "backend", "dtype", "threads",
            "memory_limit", "ranges", "pad", "bounds", "fill", "mesh", "shard")


@dataclass(frozen=True)
class EinsumPlan:
    """The translation for given operand shapes: the statement (or program) text, the
    operands' names in it, and the shape each operand is reshaped to first (its stretched
    length-1 axes dropped), or None where it is used as it is."""
    source: str
    names: Tuple[str, ...]
    reshapes: Tuple[Optional[Tuple[int, ...]], ...]
    output: str
    # one operand, every label kept: the result is a strided view of it (a transpose,
    # a diagonal), which numpy.einsum returns as a view
    view: bool = False


def _error(message: str, subscripts: str) -> EinfuseSyntaxError:
    return EinfuseSyntaxError(message, source=subscripts, span=(0, len(subscripts)))


def _check_marks(subscripts: str) -> None:
    """Dots and arrows as numpy and torch read them, checked before spaces are dropped:
    each '.' is one of an ellipsis's three ('. ..' is not '...'), and '-' is the start
    of '->' ('- >' is not an arrow)."""
    for run in re.finditer(r"\.+", subscripts):
        if len(run.group()) != 3:
            raise EinfuseSyntaxError(
                f"einsum subscripts hold '.' only as an ellipsis '...'; {subscripts!r} has "
                f"{run.group()!r} at position {run.start()}", source=subscripts,
                span=run.span())
    for mark in re.finditer(r"->|[->]", subscripts):
        if mark.group() != "->":
            raise EinfuseSyntaxError(
                f"einsum subscripts hold '-' and '>' only as the arrow '->'; {subscripts!r} "
                f"has {mark.group()!r} alone at position {mark.start()}", source=subscripts,
                span=mark.span())


def _terms(subscripts: str, count: int) -> Tuple[List[str], Optional[str]]:
    _check_marks(subscripts)
    text = subscripts.replace(" ", "")
    if text.count("->") > 1:
        raise _error("an einsum string has at most one '->'", subscripts)
    inputs, _, output = text.partition("->")
    terms = inputs.split(",")
    if len(terms) != count:
        raise _error(f"the subscripts name {len(terms)} operand(s) but {count} were given",
                     subscripts)
    for term in terms + ([output] if "->" in text else []):
        rest = term.replace("...", "")
        bad = [c for c in rest if c not in _LETTERS]
        if bad or term.count("...") > 1:
            raise _error(f"einsum subscripts are letters and at most one '...' per operand; "
                         f"{term!r} has {bad[0] if bad else '...'!r}", subscripts)
    return terms, (output if "->" in text else None)


def _axes(term: str, ndim: int, operand: int, subscripts: str) -> List[str]:
    """One label per axis of an operand, '...' expanded into broadcast labels."""
    letters = list(term.replace("...", ""))
    if "..." not in term:
        if len(letters) != ndim:
            raise ShapeError(f"operand {operand} has {ndim} axes but its subscripts "
                             f"{term!r} name {len(letters)}", source=subscripts,
                             span=(0, len(subscripts)))
        return letters
    extra = ndim - len(letters)
    if extra < 0:
        raise ShapeError(f"operand {operand} has {ndim} axes, fewer than its subscripts "
                         f"{term!r} name", source=subscripts, span=(0, len(subscripts)))
    head, _, tail = term.partition("...")
    # right-aligned: the last axis covered by '...' is broadcast label b0
    return list(head) + [f"b{extra - 1 - k}" for k in range(extra)] + list(tail)


def plan_einsum(subscripts: str, shapes: Sequence[Tuple[int, ...]],
                optimize="auto") -> EinsumPlan:
    """The statement (or program) for these subscripts and operand shapes; remembered
    per (subscripts, shapes, optimize) when ``optimize`` is a name or a flag, so a
    repeated call does not search for a contraction path again."""
    if isinstance(subscripts, str) and isinstance(optimize, (str, bool, type(None))):
        return _remembered_plan(subscripts, tuple(tuple(s) for s in shapes), optimize)
    return _plan_einsum(subscripts, shapes, optimize)


@functools.lru_cache(maxsize=256)
def _remembered_plan(subscripts: str, shapes, optimize) -> EinsumPlan:
    return _plan_einsum(subscripts, shapes, optimize)


def _plan_einsum(subscripts: str, shapes: Sequence[Tuple[int, ...]],
                 optimize="auto") -> EinsumPlan:
    if not isinstance(subscripts, str):
        raise EinfuseSyntaxError(f"einsum's subscripts are a string, not "
                                 f"{type(subscripts).__name__}")
    if not shapes:
        raise _error("einsum needs at least one operand", subscripts)
    terms, output = _terms(subscripts, len(shapes))
    axes = [_axes(t, len(s), n, subscripts) for n, (t, s) in enumerate(zip(terms, shapes))]
    extents: Dict[str, int] = {}
    for n, (labels, shape) in enumerate(zip(axes, shapes)):
        own: Dict[str, int] = {}
        for label, extent in zip(labels, shape):
            # a label repeated inside one operand is its diagonal: no stretching there
            if own.setdefault(label, extent) != extent:
                raise ShapeError(f"label {label!r} is repeated in operand {n}'s subscripts "
                                 f"{terms[n]!r} over axes of lengths {own[label]} and "
                                 f"{extent}; a diagonal needs equal lengths",
                                 source=subscripts, span=(0, len(subscripts)))
        for label, extent in zip(labels, shape):
            known = extents.get(label)
            if known is None or known == 1:
                extents[label] = extent
            elif extent not in (1, known):
                raise ShapeError(f"einsum label {label!r} has lengths {known} and {extent}; "
                                 "they must agree (or be 1)", source=subscripts,
                                 span=(0, len(subscripts)))
    broadcast = sorted({a for labels in axes for a in labels if a not in _LETTERS},
                       key=lambda a: -int(a[1:]))
    if output is None:
        counts: Dict[str, int] = {}
        for labels in axes:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        out = broadcast + sorted(c for c, n in counts.items() if n == 1 and c in _LETTERS)
    else:
        if "..." in output:
            head, _, tail = output.partition("...")
            out = list(head) + broadcast + list(tail)
        else:
            out = list(output)
            if broadcast and any(extents[b] != 1 for b in broadcast):
                raise _error("the output must keep '...' when the operands' '...' axes are "
                             "longer than 1", subscripts)
        seen = set()
        for label in out:
            if label in seen:
                raise _error(f"output label {label!r} appears twice", subscripts)
            if label not in extents:
                raise _error(f"output label {label!r} is not a label of any operand",
                             subscripts)
            seen.add(label)
    # an axis of length 1 that stretches against a longer one is dropped from its operand
    reshapes, kept = [], []
    for labels, shape in zip(axes, shapes):
        keep = [n for n, (label, extent) in enumerate(zip(labels, shape))
                if not (extent == 1 and extents[label] != 1)]
        kept.append([labels[n] for n in keep])
        reshapes.append(None if len(keep) == len(labels) else
                        tuple(shape[n] for n in keep))
    names = _operand_names(len(shapes), set(extents))
    steps = _path(kept, out, extents, optimize)
    view = len(axes) == 1 and reshapes[0] is None and set(axes[0]) <= set(out)
    return EinsumPlan(_render(kept, out, names, steps), tuple(names), tuple(reshapes), "out",
                      view)


def _operand_names(count: int, labels) -> List[str]:
    free = [c for c in string.ascii_uppercase if c not in labels]
    return free[:count] if len(free) >= count else [f"T{n}" for n in range(count)]


def _path(axes: List[List[str]], out: List[str], extents, optimize):
    """Pairs of operand positions to contract, in order (opt_einsum's convention: the
    pair's result goes to the end of the list); [] for one fused statement."""
    memory_limit = None
    if isinstance(optimize, tuple) and len(optimize) == 2 and \
            isinstance(optimize[0], str) and optimize[0] != "einsum_path":
        optimize, memory_limit = optimize      # numpy's (strategy, memory limit)
    elif isinstance(optimize, (list, tuple)):
        path = _checked_path(optimize, len(axes))
        return path if len(axes) >= 3 else []
    if optimize is False or len(axes) < 3:
        return []
    import opt_einsum
    names = sorted(extents)
    symbol = {name: opt_einsum.get_symbol(k) for k, name in enumerate(names)}
    equation = ",".join("".join(symbol[a] for a in labels) for labels in axes) + "->" + \
        "".join(symbol[a] for a in out)
    strategy = "auto" if optimize in (True, "auto") else optimize
    shapes = [tuple(extents[a] for a in labels) for labels in axes]
    try:
        path, _ = opt_einsum.contract_path(equation, *shapes, shapes=True,
                                           optimize=strategy, memory_limit=memory_limit)
    except (KeyError, TypeError, ValueError) as error:
        from ..errors import OptionError
        raise OptionError(f"optimize={optimize!r} is not a contraction-path search "
                          f"opt_einsum knows ({error}); use 'auto', 'greedy', 'optimal', "
                          "True, False or an explicit path") from None
    return [tuple(step) for step in path]


def _checked_path(optimize, count: int) -> List[Tuple[int, ...]]:
    """An explicit path (numpy.einsum_path's list, its leading 'einsum_path' optional)
    checked against ``count`` operands: each step names distinct operands among those
    still pending, and the path ends with one."""
    from ..errors import ContractionPathError
    steps = list(optimize)
    if steps and steps[0] == "einsum_path":
        steps = steps[1:]
    pending, path = count, []
    for number, step in enumerate(steps):
        try:
            picked = tuple(step)
        except TypeError:
            picked = None
        if not picked or isinstance(step, str) or any(
                isinstance(k, bool) or not isinstance(k, (int, np.integer)) or
                not 0 <= k < pending for k in picked) or len(set(picked)) != len(picked):
            raise ContractionPathError(
                f"step {number} of the einsum path, {step!r}, is not a tuple of distinct "
                f"positions among the {pending} operands pending then")
        path.append(tuple(int(k) for k in picked))
        pending += 1 - len(picked)
    if pending != 1:
        raise ContractionPathError(f"the einsum path leaves {pending} operands, not one: "
                                   f"{pending - 1} more have to be contracted")
    return path


def _access(name: str, labels: Sequence[str]) -> str:
    return f"{name}[{', '.join(labels)}]" if labels else f"{name}[]"


def _render(axes: List[List[str]], out: List[str], names: List[str], steps) -> str:
    lhs = f"out[{', '.join(out)}]" if out else "out"
    if not steps:
        return f"{lhs} := " + " * ".join(_access(n, a) for n, a in zip(names, axes))
    pending = list(zip(names, axes))
    lines = []
    for number, step in enumerate(steps):
        picked = [pending[k] for k in step]
        pending = [p for k, p in enumerate(pending) if k not in step]
        last = not pending and number == len(steps) - 1
        if last:
            target, labels = "out", out
        else:
            needed = set(out) | {a for _, labels in pending for a in labels}
            labels = []
            for _, own in picked:
                for label in own:   # a label repeated in one operand is one axis here
                    if label in needed and label not in labels:
                        labels.append(label)
            target = f"t{number}"
        body = " * ".join(_access(n, a) for n, a in picked)
        head = (f"{target}[{', '.join(labels)}]" if labels else target) if not last else lhs
        lines.append(f"{head} := {body}")
        if not last:
            pending.append((target, labels))
    if pending:   # a path that leaves operands: one more statement joins them
        lines.append(f"{lhs} := " + " * ".join(_access(n, a) for n, a in pending))
    return "\n".join(lines)


# numpy's labels for the integers of the sublist form: 0-25 upper case, 26-51 lower
# case, so that the implicit output (labels in character order) is in integer order
_SUBLIST_LABELS = string.ascii_uppercase + string.ascii_lowercase


def _sublist_text(sublist, position: str) -> str:
    try:
        items = list(sublist)
    except TypeError:
        items = None
    if items is None or isinstance(sublist, str):
        raise EinfuseTypeError(f"in einsum's sublist form, {position} is a list of "
                               f"integers (and ...), not {type(sublist).__name__}")
    text = []
    for item in items:
        if item is Ellipsis:
            text.append("...")
        elif isinstance(item, bool) or not isinstance(item, (int, np.integer)) or \
                not 0 <= int(item) < len(_SUBLIST_LABELS):
            shown = repr(item) if len(repr(item)) <= 40 else type(item).__name__
            # numpy: a label of the wrong type is a TypeError, one out of range a ValueError
            kind = EinfuseSyntaxError if isinstance(item, (int, np.integer)) and \
                not isinstance(item, bool) else EinfuseTypeError
            raise kind(f"in einsum's sublist form, {position} holds "
                       f"{shown}: labels are integers from 0 to 51 or ...")
        else:
            text.append(_SUBLIST_LABELS[int(item)])
    return "".join(text)


def from_sublists(arguments: Sequence) -> Tuple[str, List]:
    """numpy.einsum's interleaved form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` as
    (subscripts, operands)."""
    if len(arguments) < 2:
        raise EinfuseTypeError("einsum's subscripts are a string, or numpy's sublist form "
                               "(operand, [labels], operand, [labels], ..., [output])")
    operands = list(arguments[0::2])
    sublists = list(arguments[1::2])
    output = None
    if len(arguments) % 2:        # an odd count: the last is the output's sublist
        output = operands.pop()
        output = _sublist_text(output, "the output")
    terms = [_sublist_text(s, f"the sublist of operand {n}") for n, s in enumerate(sublists)]
    return ",".join(terms) + ("" if output is None else "->" + output), operands


_CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def _numpy_keywords(operands, options, casting: str, order: str) -> None:
    """numpy.einsum's ``casting`` rule for ``dtype=`` (checked on NumPy operands) and
    its ``order`` values."""
    from ..errors import OptionError
    if casting not in _CASTINGS:
        raise OptionError(f"casting={casting!r}: it is one of {', '.join(_CASTINGS)}")
    if not isinstance(order, str) or order.upper() not in ("K", "A", "C", "F"):
        raise OptionError(f"order={order!r}: it is one of K, A, C, F")
    wanted = options.get("dtype")
    if wanted is None:
        return
    from ..runtime.frameworks import NUMPY, framework_of
    if framework_of(wanted) == NUMPY:        # a torch dtype is ein's to check
        try:
            wanted = np.dtype(wanted)
        except TypeError:
            raise EinfuseTypeError(f"dtype={wanted!r} is not a data type") from None
    for n, op in enumerate(operands):
        if isinstance(op, np.ndarray) and not np.can_cast(op.dtype, wanted, casting):
            raise EinfuseTypeError(f"operand {n} of dtype {op.dtype} cannot be cast to "
                                   f"dtype={np.dtype(wanted).name} under "
                                   f"casting={casting!r} (numpy.einsum's rule)")


def _into(out, result, casting: str):
    """numpy.einsum's ``out=``: the result written into ``out``, which is returned."""
    if not isinstance(out, np.ndarray) and not hasattr(out, "copy_"):
        raise EinfuseTypeError(f"out= is a {type(out).__name__}; it must be a NumPy array "
                               "or a torch tensor (JAX arrays are immutable)")
    if tuple(out.shape) != tuple(result.shape):
        raise ShapeError(f"out= has shape {tuple(getattr(out, 'shape', ()))} but the result "
                         f"has shape {tuple(result.shape)}")
    if isinstance(out, np.ndarray):
        result = np.asarray(result)
        if not np.can_cast(result.dtype, out.dtype, casting):
            raise EinfuseTypeError(f"the result of dtype {result.dtype} cannot be written "
                                   f"into out= of dtype {out.dtype} under "
                                   f"casting={casting!r} (numpy.einsum's rule)")
        np.copyto(out, result, casting="unsafe")
        return out
    out.copy_(result)               # a torch tensor
    return out


def einsum(subscripts: str = None, *operands, optimize="auto", backend="auto", out=None,
           casting: str = "safe", order: str = "K", **options):
    """numpy.einsum's semantics on NumPy, PyTorch (differentiable) and JAX (jit, grad,
    vmap) arrays: ``ef.einsum("bthr,bThr->bhtT", Q, K)``.  Two operands become one
    statement; three or more a program of pairwise contractions in the order opt_einsum
    finds (``optimize=False``: one fused statement; "greedy", "optimal" or an explicit
    path choose the search).  numpy's sublist form, ``ef.einsum(a, [0, 1], b, [1, 2])``,
    and its ``out=``, ``casting=`` and ``order=`` work too.  Other keywords are
    ``ein``'s options."""
    from ..errors import EinfuseError, attach_statement
    from ..runtime.kernel import ein
    unknown = [name for name in options if name not in KEYWORDS]
    if unknown:    # (numpy: a TypeError; an UnexpectedArgumentError is one)
        error = unexpected_keywords("einsum()", unknown, KEYWORDS)
        raise attach_statement(error, subscripts) if isinstance(subscripts, str) else error
    if subscripts is None and not operands:
        raise EinfuseSyntaxError("einsum needs its subscripts and at least one operand")
    if not isinstance(subscripts, str):    # numpy's sublist form
        subscripts, operands = from_sublists((subscripts,) + operands)
    operands = [op if hasattr(op, "shape") else np.asarray(op) for op in operands]
    shapes = [tuple(op.shape) for op in operands]
    try:
        _numpy_keywords(operands, options, casting, order)
        plan = plan_einsum(subscripts, shapes, optimize)
    except EinfuseError as error:
        raise attach_statement(error, subscripts) from None
    if plan.view and out is None and "dtype" not in options and order.upper() != "F" and \
            type(operands[0]) is np.ndarray and operands[0].dtype.kind in "biuf":
        # nothing to compute: numpy's own view of the operand (writeable, as numpy's)
        return np.einsum(subscripts, operands[0])
    arrays = {name: (op if shape is None else op.reshape(shape))
              for name, op, shape in zip(plan.names, operands, plan.reshapes)}
    result = ein(plan.source, backend=backend, arrays=arrays, outputs=(plan.output,)
                 if "\n" in plan.source else None, **options)
    if operands and "dtype" not in options and \
            all(str(op.dtype).endswith("bool") for op in operands):
        # numpy.einsum sums bool products in bool (an or of ands); einfuse sums them
        # as integers (notation.md), so the count becomes its truth value here
        result = result != 0
    if order.upper() == "F" and isinstance(result, np.ndarray):
        result = np.asfortranarray(result)
    if out is not None:
        try:
            return _into(out, result, casting)
        except EinfuseError as error:
            raise attach_statement(error, subscripts) from None
    return result


@dataclass
class EinsumExplanation:
    """An einsum string's explanation: the equivalent statement (or program) first, then
    its usual explanation."""
    subscripts: str
    source: str
    names: Tuple[str, ...]
    inner: object

    def page(self):
        """The statement's picture with this call first (docs/pictures.md)."""
        return front_end_page(self.inner, str(self).split("\n\n")[0], str(self))

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        save_page(self.page(), path)

    def __str__(self) -> str:
        operands = ", ".join(f"{name} = operand {n}" for n, name in enumerate(self.names))
        lines = [f"einsum {self.subscripts!r} in index notation ({operands}):"]
        lines += ["  " + line for line in self.source.splitlines()]
        return "\n".join(lines) + "\n\n" + str(self.inner)


def explain_einsum(subscripts: str, operands, shapes, explain, optimize="auto",
                   **options) -> EinsumExplanation:
    """``explain`` (einfuse's) of the statement an einsum string becomes, for operands
    or their ``shapes`` (a list, one shape per operand)."""
    import numpy as np
    if operands:
        operands = [op if hasattr(op, "shape") else np.asarray(op) for op in operands]
        given = [tuple(op.shape) for op in operands]
    elif shapes is not None:
        given = [tuple(int(n) for n in shape) for shape in (
            shapes.values() if isinstance(shapes, dict) else shapes)]
    else:
        given = None
    if given is None:
        raise EinfuseSyntaxError(f"explaining the einsum string {subscripts!r} needs its "
                                 "operands or shapes=[...] (one shape per operand)",
                                 source=subscripts, span=(0, len(subscripts)))
    plan = plan_einsum(subscripts, given, optimize)
    shaped = {name: (shape if reshape is None else reshape)
              for name, shape, reshape in zip(plan.names, given, plan.reshapes)}
    inner = explain(plan.source, shapes=shaped, **options)
    return EinsumExplanation(subscripts, plan.source, plan.names, inner)
