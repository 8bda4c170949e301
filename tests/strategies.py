"""Hypothesis strategies for random *valid* einfuse statements with matching arrays.

The generator chooses every index's range first and then sizes every array so
that each read is in range, which makes the ranges einfuse must infer known in
advance.  Rules that keep that inference provably right without ``ranges=``:

* every index but a convolution index has a *plain* use (``A[i, k]``, or inside
  an index array ``W[I0[b], d]``) in an array whose axis is exactly the index's
  upper bound, and its range starts at 0;
* an affine subscript (``X[2*i + j + 1]``) uses only indices with plain uses,
  with non-negative coefficients and a constant that keeps the smallest value
  at or above 0; its axis is at least one past the largest value, so the
  intersection of valid ranges is exactly the plain range;
* a convolution index ``i`` appears in exactly one access, as ``X[c*i + a]``
  (c = 1 or 2, constant 0) with ``a`` a plain index starting at 0, and ``X``
  holds exactly ``c*(len(i)-1) + len(a)`` elements on that axis: the 'valid'
  convolution, so ``i``'s inferred range is ``[0, len(i))``;
* ranges that start above 0 (which is what lets ``X[2*i + a - 1]`` stay in
  range) are always passed explicitly in ``ranges=``, as are some others;
* with ``pad=``, affine reads may fall outside their arrays (and read the pad);
  ranges still come from plain uses.

Values are multiples of 1/64 in [-2, 2], exact in float32, so comparisons of
raw reads against constants agree between float32 and float64.  Every
generated function is applied only where it is finite in both precisions: the
generator tracks a bound on each subexpression's magnitude and only applies
``exp`` to small arguments, squashes the body of a large ``prod``, and so on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from hypothesis import strategies as st

INDEX_POOL = ("i", "j", "k", "l", "m", "n")
TENSOR_NAMES = tuple("ABCDEFGHKLMNPQRSTUVWXYZ")
PARAM_NAMES = ("alpha", "beta")
OUTPUT = "Out"
REDUCTIONS = ("sum", "prod", "max", "min", "logsumexp")
BOUNDS_MODES = ("check", "promise", "clip", "wrap", "fill")
VALUE_LIMIT = 2.0          # |array values|, |pad|, |fill|, |params| never exceed this
TAME_LIMIT = 1e6           # larger magnitudes are squashed with tanh before growing further


@dataclass
class Example:
    """One generated call: ``ein(text, **arrays, **params, **options())``."""
    text: str
    arrays: Dict[str, np.ndarray]
    params: Dict[str, float]
    ranges: Dict[str, Tuple[int, int]]   # every index's range, what einfuse must arrive at
    explicit_ranges: Dict[str, object]   # what to pass as ranges= (ints or range objects)
    pad: Optional[float] = None
    bounds: Optional[str] = None         # None: the default ("check"), not passed
    fill: Optional[float] = None
    out: Optional[np.ndarray] = None     # the existing output of '=' / '+='
    output_shape: Tuple[int, ...] = ()

    @property
    def pass_ranges(self) -> bool:
        return bool(self.explicit_ranges)

    def options(self) -> Dict[str, object]:
        """Keyword options for ``einfuse.ein`` (those that differ from the defaults)."""
        options: Dict[str, object] = {}
        if self.explicit_ranges:
            options["ranges"] = dict(self.explicit_ranges)
        if self.pad is not None:
            options["pad"] = self.pad
        if self.bounds is not None:
            options["bounds"] = self.bounds
        if self.fill is not None:
            options["fill"] = self.fill
        return options

    def oracle_options(self) -> Dict[str, object]:
        return {"pad": self.pad, "bounds": self.bounds or "check",
                "fill": 0.0 if self.fill is None else self.fill}

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        lines = [f"Example({self.text!r}", f"  ranges={self.ranges}",
                 f"  options={self.options()}", f"  params={self.params}"]
        for name, array in self.arrays.items():
            lines.append(f"  {name} ({array.dtype}) = {array.tolist()!r}")
        if self.out is not None:
            lines.append(f"  out = {self.out.tolist()!r}")
        return "\n".join(lines) + ")"


@dataclass(frozen=True)
class _E:
    """A generated expression: its text and a bound on its magnitude."""
    text: str
    bound: float


@dataclass
class _Conv:
    index: str      # the convolution index, used nowhere else
    partner: str    # the plain index added to it
    stride: int


@dataclass
class _Leaf:
    scope: List[str]                            # indices that may be used
    cover: List[str] = field(default_factory=list)  # indices that must get a plain use here
    conv: Optional[_Conv] = None


class _Builder:
    """Draws one example; every random choice goes through hypothesis's ``draw``."""

    def __init__(self, draw):
        self.draw = draw
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        self.arrays: Dict[str, np.ndarray] = {}
        self.params: Dict[str, float] = {}
        self.tensor_count = 0
        self.index_array_count = 0
        self.raw_reads: List[str] = []   # exact input reads of the current leaf

    # -- small helpers ---------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) < p * 1000

    def pick(self, options: Sequence):
        return self.draw(st.sampled_from(list(options)))

    def values(self, shape) -> np.ndarray:
        steps = self.rng.integers(-64 * int(VALUE_LIMIT), 64 * int(VALUE_LIMIT) + 1, size=shape)
        return np.asarray(steps / 64.0, dtype=np.float64)  # 0-d arrays too, not scalars

    def scalar(self) -> float:
        return self.draw(st.integers(-16, 16)) / 8.0

    def new_tensor(self, shape) -> str:
        name = TENSOR_NAMES[self.tensor_count] if self.tensor_count < len(TENSOR_NAMES) \
            else f"T{self.tensor_count}"
        self.tensor_count += 1
        self.arrays[name] = self.values(tuple(shape))
        return name

    # -- the whole example -----------------------------------------------------------------
    def build(self) -> Example:
        draw = self.draw
        count = draw(st.integers(1, 4))
        names = list(draw(st.permutations(INDEX_POOL)))[:count]
        self.explicit_mode = self.chance(0.2)
        self.pad = self.scalar() if self.chance(0.1) else None
        self.bounds = self.pick((None, None, None) + BOUNDS_MODES)
        self.fill = self.scalar() if self.bounds == "fill" and self.chance(0.7) else None
        self.lo: Dict[str, int] = {}
        self.hi: Dict[str, int] = {}
        explicit: Dict[str, object] = {}
        for name in names:
            lo = draw(st.integers(0, 2)) if self.explicit_mode else 0
            extent = draw(st.integers(1, 5))
            self.lo[name], self.hi[name] = lo, lo + extent
            if lo > 0 or (self.explicit_mode and self.chance(0.5)):
                explicit[name] = range(lo, lo + extent) if lo > 0 or self.chance(0.5) \
                    else extent

        out_count = self.pick(range(count + 1))
        outputs, reduced = names[:out_count], names[out_count:]
        self.conv = self.choose_conv(names)
        bool_mode = not reduced and self.chance(0.07)
        assign = ":=" if bool_mode else self.pick((":=",) * 5 + ("=", "+="))
        if bool_mode:
            rhs = self.comparison(names)
        elif reduced and self.chance(0.65):
            rhs = self.explicit_rhs(outputs, reduced)
        else:
            rhs = self.leaf(_Leaf(names, self.coverable(names), self.conv))

        shape = tuple(self.hi[n] - self.lo[n] for n in outputs)
        out = None
        if assign != ":=":
            out = self.values(shape)
            if self.chance(0.3):
                subs = ", ".join(outputs)
                rhs = _E(f"(0.5 * {OUTPUT}[{subs}] + {rhs.text})", rhs.bound + 1)
        lhs = f"{OUTPUT}[{', '.join(outputs)}]" if outputs or self.chance(0.3) else OUTPUT
        return Example(text=f"{lhs} {assign} {rhs.text}", arrays=self.arrays,
                       params=self.params,
                       ranges={n: (self.lo[n], self.hi[n]) for n in names},
                       explicit_ranges=explicit, pad=self.pad, bounds=self.bounds,
                       fill=self.fill, out=out, output_shape=shape)

    def choose_conv(self, names: List[str]) -> Optional[_Conv]:
        """Maybe make one index a convolution index (see the module docstring)."""
        starting_at_zero = [n for n in names if self.lo[n] == 0]
        if self.pad is not None or len(starting_at_zero) < 2 or not self.chance(0.3):
            return None
        index, partner = self.draw(st.permutations(starting_at_zero))[:2]
        return _Conv(index, partner, self.pick((1, 1, 2)))

    def coverable(self, names: Sequence[str]) -> List[str]:
        """``names`` less the convolution index (which gets no plain use)."""
        return [n for n in names if self.conv is None or n != self.conv.index]

    # -- explicit reductions ---------------------------------------------------------------
    def explicit_rhs(self, outputs: List[str], reduced: List[str]) -> _E:
        """``fin(op[G1](leaf1 (+) fin(op[G2](leaf2)))) (+) top_leaf``, parts optional."""
        split = self.draw(st.integers(1, len(reduced)))
        outer, inner = reduced[:split], reduced[split:]
        top = _Leaf(list(outputs)) if self.chance(0.35) else None
        middle_scope = outputs + outer
        middle = _Leaf(middle_scope) if not inner or self.chance(0.6) else None
        innermost = _Leaf(middle_scope + inner) if inner else None
        leaves = [leaf for leaf in (top, middle, innermost) if leaf is not None]
        for name in self.coverable(outputs + reduced):
            candidates = [leaf for leaf in leaves if name in leaf.scope]
            if name in inner:
                candidates = [innermost]
            self.pick_leaf(candidates).cover.append(name)
        (innermost or middle).conv = self.conv

        body = None
        if innermost is not None:
            body = self.reduction(inner, self.leaf(innermost))
        if middle is not None:
            part = self.leaf(middle)
            body = part if body is None else self.combine(part, body, middle_scope)
        result = self.reduction(outer, body)
        if top is not None:
            part = self.leaf(top)
            result = self.combine(part, result, outputs) if self.chance(0.5) \
                else self.combine(result, part, outputs)
        return self.maybe_function(result, 0.2)

    def pick_leaf(self, candidates: List[_Leaf]) -> _Leaf:
        return candidates[self.draw(st.integers(0, len(candidates) - 1))]

    def reduction(self, indices: List[str], body: _E) -> _E:
        count = math.prod(self.hi[n] - self.lo[n] for n in indices)
        op = self.pick(REDUCTIONS)
        head = f"{op}[{', '.join(indices)}]"
        if op == "sum" and body.bound <= 8 and self.chance(0.25):
            # log(sum(exp(...))): the finaliser's argument is positive by construction
            total = count * math.exp(body.bound)
            return _E(f"log({head}(exp({body.text})))", math.log(total))
        if op == "prod" and _power_bound(body.bound, count) > TAME_LIMIT:
            body = _E(f"tanh({body.text})", 1.0)
        bound = {"sum": count * body.bound, "prod": _power_bound(body.bound, count),
                 "max": body.bound, "min": body.bound,
                 "logsumexp": body.bound + math.log(count)}[op]
        return self.maybe_function(_E(f"{head}({body.text})", bound), 0.35)

    # -- leaves: accesses combined by operators and functions -------------------------------
    def leaf(self, leaf: _Leaf) -> _E:
        saved, self.raw_reads = self.raw_reads, []
        plain_scope = self.coverable(leaf.scope)
        count = self.draw(st.integers(1, 3))
        groups: List[List[str]] = [[] for _ in range(count)]
        for name in leaf.cover:
            groups[self.draw(st.integers(0, count - 1))].append(name)
        pieces = []
        for group in groups:
            for name in plain_scope:
                if name not in group and len(group) < 3 and self.chance(0.15):
                    group.append(name)
            pieces.append(self.access(list(self.draw(st.permutations(group))), plain_scope))
        if leaf.conv is not None:
            pieces.append(self.conv_access(leaf.conv, plain_scope))
        pieces = [self.maybe_function(piece, 0.3) for piece in pieces]
        order = self.draw(st.permutations(range(len(pieces))))
        result = pieces[order[0]]
        for k in order[1:]:
            result = self.combine(result, pieces[k], leaf.scope)
        result = self.decorate(result, leaf.scope)
        self.raw_reads = saved
        return result

    def access(self, indices: List[str], scope: List[str]) -> _E:
        """A read of a new tensor; plain subscripts for ``indices`` and maybe more axes."""
        subs = [(name, self.hi[name]) for name in indices]
        if indices and self.chance(0.1):
            return self.gather_access(subs)
        if scope and len(subs) < 4 and self.chance(0.3):
            subs.insert(self.draw(st.integers(0, len(subs))), self.affine_subscript(scope))
        if len(subs) < 4 and self.chance(0.1):
            constant = self.draw(st.integers(0, 2))
            subs.insert(self.draw(st.integers(0, len(subs))),
                        (str(constant), constant + 1 + self.draw(st.integers(0, 1))))
        name = self.new_tensor([size for _, size in subs])
        text = f"{name}[{', '.join(text for text, _ in subs)}]"
        self.raw_reads.append(text)
        return _E(text, VALUE_LIMIT)

    def affine_subscript(self, scope: List[str]) -> Tuple[str, int]:
        """``c1*i + c2*j + c`` over plain-used indices, and the axis size it needs."""
        chosen = list(self.draw(st.permutations(scope)))[:self.draw(st.integers(1, 2))]
        coeffs = [self.pick((1, 1, 2)) for _ in chosen]
        smallest = sum(c * self.lo[n] for n, c in zip(chosen, coeffs))
        largest = sum(c * (self.hi[n] - 1) for n, c in zip(chosen, coeffs))
        if self.pad is None:
            constant = self.draw(st.integers(-smallest, 2))
            size = largest + constant + 1 + self.draw(st.integers(0, 1))
        else:  # reads may fall outside on either side and read the pad value
            constant = self.draw(st.integers(-2, 2))
            size = self.draw(st.integers(1, max(1, largest + constant + 2)))
        quasi = self.chance(0.15)
        if len(chosen) == 1 and coeffs == [1] and constant == 0 and not quasi:
            return self.affine_subscript(scope)  # that would be a plain use; draw again
        terms = [name if c == 1 else f"{c}*{name}" for name, c in zip(chosen, coeffs)]
        text = " + ".join(terms)
        if constant:
            text += f" + {constant}" if constant > 0 else f" - {-constant}"
        if quasi:   # (affine) // d or (affine) % d, the affine part >= 0 without pad=
            d, op = self.draw(st.integers(2, 3)), self.pick(("//", "%"))
            text = f"({text}) {op} {d}"
            if self.pad is None:
                size = ((largest + constant) // d if op == "//" else d - 1) + 1 + \
                    self.draw(st.integers(0, 1))
        return text, size

    def gather_access(self, subs: List[Tuple[str, int]]) -> _E:
        """``W[..., I0[b] + c, ...]``: some plain subscripts move into an index array."""
        inside = self.draw(st.integers(1, min(2, len(subs))))
        index_subs, kept = subs[:inside], subs[inside:]
        rows = self.draw(st.integers(1, 5))
        offset = self.pick((0, 0, 1, -1))
        shape = tuple(size for _, size in index_subs)
        if self.bounds in ("clip", "wrap", "fill"):
            values = self.rng.integers(-3, rows + 3, size=shape)
        else:  # every gathered value plus the offset must land in [0, rows)
            low, high = max(0, -offset), rows - max(0, offset)
            if high <= low:
                offset, low, high = 0, 0, rows
            values = self.rng.integers(low, high, size=shape)
        index_name = f"I{self.index_array_count}"
        self.index_array_count += 1
        self.arrays[index_name] = values.astype(self.pick((np.int32, np.int64)))
        gather = f"{index_name}[{', '.join(text for text, _ in index_subs)}]"
        if offset:
            gather += f" + {offset}" if offset > 0 else f" - {-offset}"
        kept.insert(self.draw(st.integers(0, len(kept))), (gather, rows))
        name = self.new_tensor([size for _, size in kept])
        text = f"{name}[{', '.join(text for text, _ in kept)}]"
        self.raw_reads.append(text)
        return _E(text, VALUE_LIMIT)

    def conv_access(self, conv: _Conv, scope: List[str]) -> _E:
        """``X[c*i + a, ...]`` sized for exactly the valid range of ``i``."""
        extent = self.hi[conv.index] - self.lo[conv.index]
        partner = self.hi[conv.partner] - self.lo[conv.partner]
        term = conv.index if conv.stride == 1 else f"{conv.stride}*{conv.index}"
        subs = [(f"{term} + {conv.partner}", conv.stride * (extent - 1) + partner)]
        others = [n for n in scope if n != conv.partner]
        if others and self.chance(0.4):
            other = self.pick(others)
            subs.insert(self.draw(st.integers(0, 1)), (other, self.hi[other]))
        name = self.new_tensor([size for _, size in subs])
        text = f"{name}[{', '.join(text for text, _ in subs)}]"
        self.raw_reads.append(text)
        return _E(text, VALUE_LIMIT)

    # -- operators and functions --------------------------------------------------------------
    def combine(self, left: _E, right: _E, scope: List[str]) -> _E:
        left, right = self.tame(left), self.tame(right)
        op = self.pick(("+", "-", "*", "*", "div", "min", "max", "where", "atan2"))
        if op == "where" and not scope and not self.raw_reads:
            op = "max"  # no index and no read to build a condition from
        if op in ("+", "-"):
            return _E(f"({left.text} {op} {right.text})", left.bound + right.bound)
        if op == "*":
            return _E(f"({left.text} * {right.text})", left.bound * right.bound)
        if op == "div":
            return _E(f"({left.text} / (1 + {right.text} ** 2))", left.bound)
        if op in ("min", "max"):
            return _E(f"{op}({left.text}, {right.text})", max(left.bound, right.bound))
        if op == "atan2":   # a positive second argument: no branch cut to straddle
            return _E(f"atan2({left.text}, 1 + {right.text} ** 2)", math.pi / 2)
        return _E(f"where({self.condition(scope)}, {left.text}, {right.text})",
                  max(left.bound, right.bound))

    def condition(self, scope: List[str]) -> str:
        """An exact condition: raw reads against constants, or index comparisons."""
        if self.raw_reads and (not scope or self.chance(0.6)):
            read = self.pick(self.raw_reads)
            return f"{read} {self.pick(('>', '<', '>=', '<=', '!='))} " \
                   f"{self.pick(('0', '0.25', '-0.5', '1'))}"
        return self.index_condition(scope)

    def index_condition(self, scope: List[str]) -> str:
        a, b = self.pick(scope), self.pick(scope)
        op = self.pick(("<", "<=", ">", ">=", "==", "!="))
        other = b if a != b else str(self.draw(st.integers(0, 3)))
        return f"{a} {op} {other}"

    def maybe_function(self, expr: _E, p: float) -> _E:
        if not self.chance(p):
            return expr
        expr = self.tame(expr)
        b = expr.bound
        choices = ["tanh", "sigmoid", "sin", "cos", "abs", "relu", "softplus", "erf",
                   "sqrt_abs", "log1p_abs", "log_abs1", "neg"]
        if b <= 8:
            choices += ["exp", "expm1"]
        if b <= 100:
            choices += ["square", "pow"]
        choices += ["tan"]
        f = self.pick(choices)
        t = expr.text
        if f in ("tanh", "sigmoid", "sin", "cos", "erf"):
            return _E(f"{f}({t})", 1.0)
        if f in ("abs", "relu"):
            return _E(f"{f}({t})", b)
        if f == "softplus":
            return _E(f"softplus({t})", b + 1)
        if f == "sqrt_abs":
            return _E(f"sqrt(abs({t}))", math.sqrt(b))
        if f == "log1p_abs":
            return _E(f"log1p(abs({t}))", math.log1p(b))
        if f == "log_abs1":
            return _E(f"log(abs({t}) + 1)", math.log1p(b))
        if f == "neg":
            return _E(f"(-{t})", b)
        if f in ("exp", "expm1"):
            return _E(f"{f}({t})", math.exp(b))
        if f == "tan":   # an argument well inside (-pi/2, pi/2)
            return _E(f"tan({t})", math.tan(b)) if b <= 1.2 else \
                _E(f"tan(tanh({t}))", math.tan(1.0))
        if f == "square":
            return _E(f"(({t}) ** 2)", b * b)
        return _E(f"pow(abs({t}) + 1, 1.5)", (b + 1) ** 1.5)

    def tame(self, expr: _E) -> _E:
        return _E(f"tanh({expr.text})", 1.0) if expr.bound > TAME_LIMIT else expr

    def decorate(self, expr: _E, scope: List[str]) -> _E:
        """Maybe mix in index values, a scalar parameter, a causal mask or a constant."""
        if scope and self.chance(0.2):
            a = self.pick(scope)
            top = max(self.hi[a], 1)
            kind = self.pick(("scale", "shift", "floor", "mask", "indicator", "divmod"))
            if kind == "scale":
                expr = _E(f"({expr.text} * ({a} + 1))", expr.bound * (top + 1))
            elif kind == "shift":
                b = self.pick(scope)
                expr = _E(f"({expr.text} + ({a} - {b}) / 4)", expr.bound + top)
            elif kind == "floor":
                expr = _E(f"({expr.text} - floor({a} / 2))", expr.bound + top)
            elif kind == "divmod":   # exact on index values, in any working dtype
                expr = _E(f"({expr.text} - {a} // 2 + {a} % 3)", expr.bound + top + 2)
            elif kind == "mask":
                expr = _E(f"where({self.index_condition(scope)}, {expr.text}, -1.5)",
                          max(expr.bound, 1.5))
            else:
                expr = _E(f"({expr.text} * ({self.index_condition(scope)}))", expr.bound)
        if self.chance(0.15):
            name = self.pick(PARAM_NAMES)
            self.params.setdefault(name, self.scalar())
            expr = _E(f"({name} * {expr.text})", VALUE_LIMIT * expr.bound) if self.chance(0.5) \
                else _E(f"({expr.text} + {name})", expr.bound + VALUE_LIMIT)
        if self.chance(0.1):
            expr = _E(f"(0.5 * {expr.text} - 1.25)", expr.bound + 1.25)
        return expr

    # -- whole-comparison (bool) statements --------------------------------------------------
    def comparison(self, names: List[str]) -> _E:
        self.raw_reads = []
        plain = self.coverable(names)
        split = self.draw(st.integers(0, len(plain)))
        reads = [self.access(list(group), plain) for group in (plain[:split], plain[split:])
                 if group or not plain]
        if self.conv is not None:
            reads.append(self.conv_access(self.conv, plain))
        if len(reads) == 1 and self.chance(0.3):
            return _E(f"-0.5 < {reads[0].text} <= 1", 1.0)   # a chained comparison
        parts = [f"({read.text} {self.pick(('>', '<=', '!='))} {self.pick(('0', '0.5'))})"
                 for read in reads]
        if self.chance(0.4):
            parts.append(f"({self.index_condition(names)})")
        if len(parts) == 1:
            return _E(parts[0][1:-1], 1.0)
        text = parts[0]
        for part in parts[1:]:
            text = f"{text} {self.pick(('&', '|'))} {part}"
        return _E(text, 1.0)


def _power_bound(bound: float, count: int) -> float:
    """A bound on a product of ``count`` factors each bounded by ``bound``."""
    if bound <= 1:
        return 1.0
    return math.inf if count * math.log(bound) > 700 else bound ** count


@st.composite
def examples(draw) -> Example:
    """A random valid statement with arrays, parameters, ranges and options."""
    return _Builder(draw).build()
