"""``ef.rearrange``, ``ef.reduce`` and ``ef.repeat`` with einops' pattern semantics.

A pattern names axes (``b h w c``), composes and decomposes them with parentheses
(``(h h2)``), keeps unit axes (``1``, ``()``), and stands ``...`` for the axes it does not
name.  The translation: the input is reshaped (a view where the framework can) into its
elementary axes, one statement over those axes does the work (a reordering, a reduction
over the axes the right side drops, or a copy along the axes it adds), and the result is
reshaped into the right side's composition.  A pure reshape (same axes, same order)
returns the framework's reshape, a view where possible."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from ..errors import (EinfuseError, EinfuseSyntaxError, ShapeError, UnexpectedArgumentError,
                      attach_statement, did_you_mean)
from ..pictures import front_end_page, save_page

Group = Tuple[str, ...]            # the elementary axes of one axis of a side

REDUCTIONS = ("sum", "mean", "max", "min", "prod", "any", "all", "logsumexp")
# the keywords that travel with the axis sizes but are options, not axis names
OPTIONS = ("backend", "dtype", "threads")
_COMPOSED_DOTS = "(...)"


def _error(message: str, pattern: str) -> EinfuseSyntaxError:
    return EinfuseSyntaxError(message, source=pattern, span=(0, len(pattern)))


# the names einfuse gives the axes under '...' ("...0", "...1") and anonymous axes
# ("3#0": length 3, the first) cannot be identifiers, so no axis of the caller's is taken
# for one; messages show them as the pattern wrote them
def _shown(names) -> str:
    shown = ["..." if n.startswith("...") else n.split("#")[0] for n in names]
    return " ".join(dict.fromkeys(shown))


def _tokens(text: str, pattern: str) -> List[str]:
    """A side's tokens by einops' own rules (einops/parsing.py): '(', ')', '...' and the
    runs of letters, digits and '_' between spaces and parentheses.  Dots stand only in
    one '...' per side, which stands apart from a name ('...pre' and 'pre...' are no
    axes); any other character (a tab, a comma) is an error."""
    if "." in text and (text.count("...") != 1 or text.count(".") != 3):
        raise _error("a side of a pattern holds dots only in one '...' (its axes not "
                     f"named), not {text.strip()!r}", pattern)
    tokens: List[str] = []
    current = ""
    position = 0
    while position < len(text):
        char = text[position]
        if text.startswith("...", position):
            if current:
                raise _error(f"'...' stands apart from axis names (a space or a "
                             f"parenthesis between them), not {current}...", pattern)
            tokens.append("...")
            position += 3
            if position < len(text) and (text[position].isalnum() or text[position] == "_"):
                end = position
                while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                    end += 1
                raise _error(f"'...' stands apart from axis names (a space or a "
                             f"parenthesis between them), not ...{text[position:end]}",
                             pattern)
            continue
        if char.isalnum() or char == "_":
            current += char
        elif char in "() ":
            if current:
                tokens.append(current)
            current = ""
            if char != " ":
                tokens.append(char)
        else:
            raise _error(f"unexpected {char!r} in the pattern (axes are separated by "
                         "spaces)", pattern)
        position += 1
    if current:
        tokens.append(current)
    for token in tokens:
        if token in ("(", ")", "...") or token.isdecimal():
            continue
        if not token.isidentifier():
            raise _error(f"{token!r} is no axis name: a name is an identifier, a length a "
                         "number", pattern)
        if token[0] == "_" or token[-1] == "_":
            raise _error(f"the axis name {token!r} starts or ends with '_', which einops "
                         "does not allow", pattern)
    return tokens


def _side(text: str, pattern: str, anonymous: List[int]) -> List[Group]:
    """Each axis of a side as its group of elementary axis names; '...' stays as the
    name '...'; anonymous sizes (a number other than 1) become fresh names."""
    groups: List[Group] = []
    current: Optional[List[str]] = None
    for token in _tokens(text, pattern):
        if token == "(":
            if current is not None:
                raise _error("parentheses do not nest in a pattern", pattern)
            current = []
        elif token == ")":
            if current is None:
                raise _error("a ')' without its '('", pattern)
            groups.append(tuple(current))
            current = None
        else:
            if token == "..." and current is not None:
                token = _COMPOSED_DOTS   # '(...)': the axes composed into one
            if token.isdecimal():
                if int(token) == 1:      # '1', '01': a unit axis
                    if current is None:
                        groups.append(())
                    continue
                if int(token) == 0:
                    raise _error(f"an anonymous axis has a positive length, not {token}",
                                 pattern)
                anonymous.append(int(token))
                token = f"{int(token)}#{len(anonymous) - 1}"
            if current is None:
                groups.append((token,))
            else:
                current.append(token)
    if current is not None:
        raise _error("a '(' is never closed", pattern)
    return groups


@dataclass(frozen=True)
class EinopsPlan:
    statement: Optional[str]              # None: a reshape alone does it
    inner_shape: Tuple[int, ...]          # the input's elementary axes
    output_shape: Tuple[int, ...]         # the right side's composed shape
    ranges: Tuple[Tuple[str, int], ...]   # extents of axes the input does not have
    reduced: Tuple[int, ...] = ()         # positions in inner_shape of the dropped axes
    # a callable reduction: the statement that orders the axes it leaves as the right
    # side does (None: they are in order already)
    after_callable: Optional[str] = None
    # the statement's index names and the pattern's axes they stand for, in order
    axes: Tuple[Tuple[str, str], ...] = ()


def plan_einops(pattern: str, shape: Tuple[int, ...], kind: str,
                reduction: Optional[str], sizes: Dict[str, int]) -> EinopsPlan:
    if not isinstance(pattern, str) or pattern.count("->") != 1:
        raise _error("an einops pattern has the form 'left -> right'", str(pattern))
    anonymous: List[int] = []
    left_text, right_text = pattern.split("->")
    left = _side(left_text, pattern, anonymous)
    right = _side(right_text, pattern, anonymous)
    names = [n for g in left for n in g]
    if _COMPOSED_DOTS in names:
        raise _error("'...' stands on the left on its own, not inside parentheses", pattern)
    if len(names) != len(set(names)):
        raise _error("an axis is named twice on the left", pattern)
    # '...' on the left covers the axes the others do not name
    ellipsis: Tuple[str, ...] = ()
    if any("..." in g for g in left):
        if sum(g.count("...") for g in left) > 1 or any("..." in g and len(g) > 1
                                                       for g in left):
            raise _error("'...' stands once on the left, not inside parentheses", pattern)
        count = len(shape) - (len(left) - 1)
        if count < 0:
            raise ShapeError(f"the input has {len(shape)} axes, fewer than {left_text.strip()!r}"
                             " names", source=pattern, span=(0, len(pattern)))
        ellipsis = tuple(f"...{k}" for k in range(count))
        at = next(k for k, g in enumerate(left) if "..." in g)
        left = left[:at] + [(n,) for n in ellipsis] + left[at + 1:]
    elif len(left) != len(shape):
        raise ShapeError(f"the pattern's left side {left_text.strip()!r} names {len(left)} "
                         f"axes but the input has {len(shape)}", source=pattern,
                         span=(0, len(pattern)))
    expanded = []
    for group in right:
        dots = "..." if "..." in group else _COMPOSED_DOTS if _COMPOSED_DOTS in group else None
        if dots is None:
            expanded.append(group)
        elif "..." not in left_text:
            raise _error("'...' on the right needs '...' on the left", pattern)
        elif dots == "...":   # standing alone: the axes it covers, each its own axis
            expanded += [(n,) for n in ellipsis]
        else:                 # inside parentheses: composed into one axis
            at = group.index(dots)
            expanded.append(group[:at] + ellipsis + group[at + 1:])
    right = expanded
    # the size of every elementary axis
    known: Dict[str, int] = {f"{n}#{k}": n for k, n in enumerate(anonymous)}
    named = {n for g in left + right for n in g}
    unused = [name for name in sizes if name not in named]
    if unused:
        axes = [n for n in dict.fromkeys(n for g in left + right for n in g)
                if n.isidentifier()]    # (not '...0' nor an anonymous '3#0')
        shown = ", ".join(f"{n}={did_you_mean(n, axes + list(OPTIONS))}" for n in unused)
        raise UnexpectedArgumentError(
            f"ef.{kind} got {shown}: {'an axis' if len(unused) == 1 else 'axes'} not in the "
            f"pattern (its axes: {' '.join(axes) or 'none named'}) and not an option "
            f"({', '.join(f'{o}=' for o in OPTIONS)})", source=pattern, span=(0, len(pattern)))
    for name, value in sizes.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise _error(f"the size {name}={value!r} must be a non-negative integer", pattern)
        known[name] = int(value)
    for group, extent in zip(left, shape):
        unknown = [n for n in group if n not in known]
        product = math.prod(known[n] for n in group if n in known)
        if len(unknown) > 1:
            raise _error(f"cannot split an axis of length {extent} into "
                         f"{_shown(unknown)}: give all but one size", pattern)
        if unknown:
            if product == 0 or extent % product:
                raise ShapeError(f"an axis of length {extent} does not split into "
                                 f"({_shown(group)}) with the sizes given", source=pattern,
                                 span=(0, len(pattern)))
            known[unknown[0]] = extent // product
        elif product != extent:
            raise ShapeError(f"({_shown(group) or '1'}) has length {product} but the "
                             f"input's axis has {extent}", source=pattern,
                             span=(0, len(pattern)))
    left_axes = [n for g in left for n in g]
    right_axes = [n for g in right for n in g]
    twice = [n for n in dict.fromkeys(right_axes) if right_axes.count(n) > 1]
    if twice:
        raise _error(f"an axis is named twice on the right: {_shown(twice)}", pattern)
    added = [n for n in right_axes if n not in left_axes]
    dropped = [n for n in left_axes if n not in right_axes]
    if kind == "rearrange" and (added or dropped):
        changes = ([f"adds {_shown(added)}"] if added else []) + \
            ([f"drops {_shown(dropped)}"] if dropped else [])
        raise _error(f"rearrange keeps every axis; this pattern {' and '.join(changes)} "
                     "(use repeat or reduce)", pattern)
    if kind == "reduce" and added:
        raise _error(f"reduce cannot add the axes {_shown(added)} (use repeat)", pattern)
    if kind == "repeat" and dropped:
        raise _error(f"repeat cannot drop the axes {_shown(dropped)} (use reduce)", pattern)
    missing = [n for n in right_axes if n not in known]
    if missing:
        raise _error(f"the size of {_shown(missing)} is not known: pass it, as in "
                     f"{missing[0]}=4", pattern)
    inner_shape = tuple(known[n] for n in left_axes)
    output_shape = tuple(math.prod(known[n] for n in g) for g in right)
    if not added and not dropped and left_axes == right_axes:
        return EinopsPlan(None, inner_shape, output_shape, ())
    # index names of the statement: a0, a1, ... (pattern names are any identifiers)
    index = {n: f"a{k}" for k, n in enumerate(dict.fromkeys(left_axes + right_axes))}
    reduced = tuple(k for k, n in enumerate(left_axes) if n in dropped)
    kept = [n for n in left_axes if n not in dropped]
    after = None if kept == right_axes else _statement(kept, right_axes, [], None, known,
                                                       index)
    return EinopsPlan(_statement(left_axes, right_axes, dropped, reduction, known, index),
                      inner_shape, output_shape, tuple((index[n], known[n]) for n in added),
                      reduced, after, tuple((i, _shown([n])) for n, i in index.items()))


def _statement(left, right, dropped, reduction, known, index) -> str:
    read = f"X[{', '.join(index[n] for n in left)}]" if left else "X[]"
    lhs = f"Y[{', '.join(index[n] for n in right)}]" if right else "Y"
    if not dropped:
        return f"{lhs} := {read}"
    over = ", ".join(index[n] for n in dropped)
    if reduction == "mean":
        count = math.prod(known[n] for n in dropped)
        return f"{lhs} := sum[{over}]({read}) / {count}"
    if reduction == "any":      # a whole right side that is a comparison is bool
        return f"{lhs} := sum[{over}]({read} != 0) > 0"
    if reduction == "all":
        return f"{lhs} := sum[{over}]({read} == 0) == 0"
    if not isinstance(reduction, str):   # a callable: planned as a sum, run by _run
        return f"{lhs} := sum[{over}]({read})"
    return f"{lhs} := {reduction}[{over}]({read})"


def _run(kind: str, x, pattern: str, reduction: Optional[str], sizes, options):
    from ..runtime.kernel import ein
    plan, inner, options = _prepared(kind, x, pattern, reduction, sizes, options)
    if plan.statement is None:
        return inner.reshape(plan.output_shape)
    if callable(reduction):
        return _run_callable(reduction, inner, plan, pattern, options)
    result = ein(plan.statement, arrays={"X": inner}, ranges=dict(plan.ranges) or None,
                 **options)
    return result.reshape(plan.output_shape)


def _prepared(kind: str, x, pattern: str, reduction, sizes, options):
    """(plan, the input split into its elementary axes, the statement's options) of a
    call: what runs, and what explain shows."""
    import numpy as np
    if isinstance(x, (list, tuple)):   # einops stacks a list along a new first axis
        x = _stacked(x, pattern)
    elif not hasattr(x, "shape"):
        x = np.asarray(x)
    if kind == "reduce" and reduction not in REDUCTIONS and not callable(reduction):
        raise attach_statement(_error(f"reduce's reduction is one of {', '.join(REDUCTIONS)}"
                                      f" or a callable f(x, axes), not {reduction!r}",
                                      pattern), pattern)
    try:
        plan = plan_einops(pattern, tuple(x.shape), kind, reduction, sizes)
    except EinfuseError as error:
        raise attach_statement(error, pattern) from None
    inner = x.reshape(plan.inner_shape)
    if plan.statement is None or callable(reduction):
        return plan, inner, options
    # (a sum or prod of small integers widens as the framework's own sum does, and a
    # copy, max or min of bools is bool, as in einops: the statement's own dtype rules)
    return plan, inner, options


@dataclass(frozen=True)
class EinopsExplanation:
    """An einops pattern's explanation: the call it is, the statement it runs (with the
    pattern's axis for each index), then that statement's explanation; or, for a
    reshape alone, that no kernel runs."""
    kind: str
    pattern: str
    reduction: Optional[str]
    plan: EinopsPlan
    inner: object           # the statement's Explanation (None: a reshape)

    def page(self):
        """The statement's picture with this call first (docs/pictures.md)."""
        return front_end_page(self.inner, str(self).split("\n\n")[0], str(self))

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        save_page(self.page(), path)

    def __str__(self) -> str:
        how = f", {self.reduction!r}" if self.reduction is not None else ""
        lines = [f"ef.{self.kind}(x, {self.pattern!r}{how}) in index notation (X: the "
                 f"input as its elementary axes, shape {self.plan.inner_shape}; Y reshaped "
                 f"to {self.plan.output_shape} is the result):"]
        if self.inner is None:
            lines.append("  no statement: the same axes in the same order, so the result "
                         "is the input reshaped (a view where its layout allows); no "
                         "kernel runs")
            return "\n".join(lines)
        lines.append(f"  {self.plan.statement}")
        lines.append("  where " + ", ".join(f"{index} is {axis}"
                                            for index, axis in self.plan.axes))
        return "\n".join(lines) + "\n\n" + str(self.inner)


def explain_einops(pattern: str, args, shapes, arrays: Dict[str, object], explain,
                   **options) -> EinopsExplanation:
    """``explain`` of an einops pattern: for its input (the one positional argument) or
    ``shapes=`` (the input's shape, or a one-entry list or dict of it); ``reduction=``
    ("sum", "mean", ...) where the pattern drops axes, and the sizes of new or split
    axes as keywords, as ``ef.reduce`` and ``ef.repeat`` take them.  Whether it is a
    rearrange, a reduce or a repeat follows from the pattern."""
    import numpy as np
    sizes = dict(arrays)
    reduction = sizes.pop("reduction", None)
    if len(args) > 1:
        raise attach_statement(_error(f"an einops pattern takes one input, not "
                                      f"{len(args)}", pattern), pattern)
    if args:
        x = args[0]
    elif shapes is not None:
        shape = _explained_shape(shapes, pattern)
        x = np.broadcast_to(np.zeros((), np.float32), shape)
    else:
        raise attach_statement(_error(f"explaining the einops pattern {pattern!r} needs "
                                      "its input or shapes=(...) (the input's shape)",
                                      pattern), pattern)
    # the sides' elementary axes as plan_einops reads them (a unit axis '1' is none; an
    # anonymous length on the left is dropped, on the right added)
    anonymous: List[int] = []
    try:
        named_left, named_right = ({n for group in _side(side, pattern, anonymous)
                                    for n in group} for side in pattern.split("->"))
    except EinfuseError as error:
        raise attach_statement(error, pattern) from None
    kind = "reduce" if named_left - named_right else \
        "repeat" if named_right - named_left else "rearrange"
    if kind == "reduce" and reduction is None:
        raise attach_statement(_error(
            f"the pattern drops {_shown(sorted(named_left - named_right))}: pass "
            f"reduction= ({', '.join(REDUCTIONS)}) to explain it as ef.reduce does",
            pattern), pattern)
    if kind != "reduce" and reduction is not None:
        raise attach_statement(_error(f"reduction={reduction!r} is for a pattern that "
                                      "drops axes; this one drops none", pattern), pattern)
    if callable(reduction):
        raise attach_statement(_error("a callable reduction runs the caller's function, "
                                      "which explain cannot show: name a reduction ("
                                      f"{', '.join(REDUCTIONS)})", pattern), pattern)
    for key in ("dtype", "backend", "threads"):
        if options.get(key) is not None:
            sizes[key] = options[key]
    plan, inner, statement_options = _prepared(kind, x, pattern, reduction, sizes,
                                               _options(sizes))
    if plan.statement is None:
        return EinopsExplanation(kind, pattern, reduction, plan, None)
    explained = explain(plan.statement, ranges=dict(plan.ranges) or None,
                        **statement_options, X=inner)
    return EinopsExplanation(kind, pattern, reduction, plan, explained)


def _explained_shape(shapes, pattern: str) -> Tuple[int, ...]:
    if isinstance(shapes, dict):
        shapes = list(shapes.values())
        if len(shapes) != 1:
            raise attach_statement(_error("shapes= for an einops pattern has one entry, "
                                          "the input's shape", pattern), pattern)
        shapes = shapes[0]
    elif isinstance(shapes, list) and len(shapes) == 1 and not isinstance(shapes[0],
                                                                          numbers.Integral):
        shapes = shapes[0]
    try:
        shape = tuple(shapes)
    except TypeError:
        shape = None
    if shape is None or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool)
                                and n >= 0 for n in shape):
        raise attach_statement(ShapeError(f"shapes= for an einops pattern is the input's "
                                          f"shape, a tuple of sizes, not {shapes!r}",
                                          source=pattern, span=(0, len(pattern))), pattern)
    return tuple(int(n) for n in shape)


def _run_callable(reduction, inner, plan: EinopsPlan, pattern: str, options):
    """einops' callable reduction: ``reduction(x, axes)`` on the elementary axes, the
    axes it leaves then ordered and composed as the right side says."""
    from ..runtime.kernel import ein
    want = tuple(n for k, n in enumerate(plan.inner_shape) if k not in plan.reduced)
    try:
        reduced = reduction(inner, plan.reduced)
    except EinfuseError:
        raise
    except Exception as error:   # the caller's function: named, with its own message
        raise attach_statement(EinfuseError(
            f"the reduction {getattr(reduction, '__name__', reduction)!r} failed on axes "
            f"{plan.reduced}: {type(error).__name__}: {error}", source=pattern,
            span=(0, len(pattern))), pattern) from error
    if tuple(getattr(reduced, "shape", ())) != want:
        raise attach_statement(ShapeError(
            f"the reduction {getattr(reduction, '__name__', reduction)!r} over axes "
            f"{plan.reduced} returned shape {tuple(getattr(reduced, 'shape', ()))}, not "
            f"{want}", source=pattern, span=(0, len(pattern))), pattern)
    if plan.after_callable is not None:     # (a copy of bools is bool)
        reduced = ein(plan.after_callable, arrays={"X": reduced}, **options)
    return reduced.reshape(plan.output_shape)


def _stacked(items, pattern: str):
    """einops' list input: the arrays stacked along a new first axis, in their framework."""
    import numpy as np
    if not len(items):
        raise attach_statement(ShapeError("the list is empty: einops stacks a list's arrays "
                                          "along a new first axis, and there are none",
                                          source=pattern, span=(0, len(pattern))), pattern)
    try:
        if any(hasattr(item, "detach") for item in items):
            import torch
            return torch.stack(list(items))
        if any(type(item).__module__.startswith("jax") for item in items):
            import jax.numpy as jnp
            return jnp.stack(list(items))
        return np.stack([np.asarray(item) for item in items])
    except (ValueError, TypeError, RuntimeError) as error:
        shapes = ", ".join(str(tuple(np.shape(item))) if not hasattr(item, "shape") else
                           str(tuple(item.shape)) for item in items[:8])
        raise attach_statement(ShapeError(
            f"the list's {len(items)} arrays do not stack into one array (they must be "
            f"arrays of one framework and one shape; their shapes are {shapes}"
            f"{', ...' if len(items) > 8 else ''}): "
            f"{type(error).__name__}: {error}", source=pattern, span=(0, len(pattern))),
            pattern) from None


def rearrange(x, pattern: str, **sizes):
    """einops.rearrange: ``ef.rearrange(x, "b (h w) c -> b h w c", h=4)``; a reordering
    runs as one kernel, a pure reshape returns the reshape (a view where possible)."""
    options = _options(sizes)
    return _run("rearrange", x, pattern, None, sizes, options)


def reduce(x, pattern: str, reduction, **sizes):
    """einops.reduce with sum, mean, max, min, prod, any, all and logsumexp, one kernel:
    ``ef.reduce(x, "b (h h2) (w w2) c -> b h w c", "max", h2=2, w2=2)``.  As in einops,
    ``reduction`` may also be a callable ``f(x, axes)`` that reduces the tuple of axes
    of ``x`` (the input split into its elementary axes); einfuse orders the rest."""
    options = _options(sizes)
    return _run("reduce", x, pattern, reduction, sizes, options)


def repeat(x, pattern: str, **sizes):
    """einops.repeat, one kernel: ``ef.repeat(x, "h w -> h w c", c=3)``."""
    options = _options(sizes)
    return _run("repeat", x, pattern, None, sizes, options)


def _options(sizes: Dict[str, Union[int, str]]) -> Dict[str, object]:
    """``backend=`` and ``dtype=`` travel with the axis sizes; they are not axis names."""
    return {key: sizes.pop(key) for key in OPTIONS if key in sizes}
