"""For backends/triton/render.py: the Triton functions every rendered kernel defines --
the math the Triton interpreter lacks (libdevice is not interpreted), written with
exp/log and series where those would cancel, pow with C99's special cases as NumPy has
them; NumPy's NaN rules for max/min; gathered positions on their exact value
(plan/gathers.py); Neumaier's compensated addition -- and the renderer's chunked sums.
"""

from typing import List

from ... import ir
from ...ir import LoopKind, ReduceOp
from ..identifiers import name

# A sum's reduction loop runs in chunks of CHUNK steps (each adding at most CHUNK terms
# into any one partial, or CHUNK times a nested loop's), folded into a compensated
# total after each (plan/sums.py says why; the C planner builds its blocks into the IR,
# Triton's plain plans get them here): a vector loop's [BLOCK, RB] tiles always, a plain
# loop (an output tile's registers, as dist's) only beyond CHUNK_LIMIT steps, where the
# folds would cost.
CHUNK_LIMIT = 1024
CHUNK = 32

HELPERS = '''
@triton.jit
def ef_neg(x):
    # -x as IEEE negation: Triton 3.6 compiles a unary minus on a float as 0 - x, which
    # is +0 for x = +0 (1/-(0 - d) came out +inf on an H100); a product by -1 is exact
    return x * -1.0


@triton.jit
def ef_expm1(x):
    # Taylor series to x**16/16! below 0.5 (exp(x) - 1 cancels there: 1e-12 would lose
    # every digit), the plain formula above; x = -0 keeps its sign
    p = 1.0 / 16.0
    for k in tl.static_range(15, 0, -1):
        p = 1.0 / k + x * p / k
    return tl.where(tl.abs(x) < 0.5, x * p, tl.exp(x) - 1.0)


@triton.jit
def ef_log1p(x):
    # log1p(x) = 2 atanh(s), s = x / (2 + x) (|s| < 1/7 below 0.25), as a series to
    # s**21; the plain formula above
    s = x / (2.0 + x)
    s2 = s * s
    p = 1.0 / 21.0
    for k in tl.static_range(19, 0, -2):
        p = 1.0 / k + s2 * p
    return tl.where(tl.abs(x) < 0.25, 2.0 * s * p, tl.log(1.0 + x))


@triton.jit
def ef_tanh(x):
    # -expm1(-2|x|) / (expm1(-2|x|) + 2), odd; tiny x (and -0) is its own tanh
    e = ef_expm1(-2.0 * tl.abs(x))
    t = ef_neg(e) / (e + 2.0)
    return tl.where(tl.abs(x) < 1e-9, x, tl.where(x < 0.0, ef_neg(t), t))


@triton.jit
def ef_pow(a, b):
    # |a|**b, then the sign and the special cases of C99's pow, which NumPy follows:
    # pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1 (even for NaN), a negative base takes
    # an integer exponent only (-inf takes any), and a zero keeps its sign for odd ones
    mag = tl.exp(b * tl.log(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & (tl.abs(b) < 9007199254740992.0) & ((b - 2.0 * tl.floor(b * 0.5)) == 1.0)
    negative = (a < 0.0) | ((a == 0.0) & (1.0 / a < 0.0))
    r = tl.where(negative & odd, ef_neg(mag), mag)
    r = tl.where((a < 0.0) & (a > float("-inf")) & ~whole, float("nan"), r)
    one = (b == 0.0) | (a == 1.0) | ((a == -1.0) & (tl.abs(b) == float("inf")))
    return tl.where(one, 1.0, r)


@triton.jit
def ef_ipow1(x):
    return x


@triton.jit
def ef_ipow2(x):
    return x * x


@triton.jit
def ef_ipow3(x):
    return x * x * x


@triton.jit
def ef_ult(x, y):
    return x.to(tl.uint64, bitcast=True) < y.to(tl.uint64, bitcast=True)


@triton.jit
def ef_mod(g, n):
    r = g % tl.maximum(n, 1)
    return tl.where(r < 0, r + n, r)


@triton.jit
def ef_modu(g, n):
    return (g.to(tl.uint64, bitcast=True) % tl.maximum(n, 1).to(tl.uint64)).to(tl.int64)


@triton.jit
def ef_addmod(x, y, n):
    return tl.where(x >= n - y, x - (n - y), x + y)


@triton.jit
def ef_negmod(r, n):
    return tl.where(r == 0, 0, n - r)


@triton.jit
def ef_qdiv(a, d):
    # Python's a // d for a positive constant d (quasi-affine subscripts), dividing
    # non-negative values only: the same whether '//' truncates or floors
    q = tl.where(a >= 0, a, -1 - a) // d
    return tl.where(a >= 0, q, -1 - q)


@triton.jit
def ef_qmod(a, d):
    # Python's a % d (in 0..d-1) for a positive constant d, likewise
    r = tl.where(a >= 0, a, -1 - a) % d
    return tl.where(a >= 0, r, d - 1 - r)


@triton.jit
def ef_sat_sp(g, a, n):
    d = g + a
    return tl.where(g < -a, -1, tl.where(ef_ult(d, n), d, n))


@triton.jit
def ef_sat_sm(g, a, n):
    d = a - g
    return tl.where(g > a, -1, tl.where(ef_ult(d, n), d, n))


@triton.jit
def ef_sat_up(g, a, n):
    d = g + a
    above = tl.where((a >= n) | ~ef_ult(g, n - a), n, d)
    below = tl.where(ef_ult(g, -a), -1, tl.where(ef_ult(d, n), d, n))
    return tl.where(a >= 0, above, below)


@triton.jit
def ef_sat_um(g, a, n):
    d = a - g
    return tl.where((a < 0) | ef_ult(a, g), -1, tl.where(ef_ult(d, n), d, n))


@triton.jit
def ef_wrap_sp(g, a, n):
    return ef_addmod(ef_mod(g, n), ef_mod(a, n), n)


@triton.jit
def ef_wrap_sm(g, a, n):
    return ef_addmod(ef_mod(a, n), ef_negmod(ef_mod(g, n), n), n)


@triton.jit
def ef_wrap_up(g, a, n):
    return ef_addmod(ef_modu(g, n), ef_mod(a, n), n)


@triton.jit
def ef_wrap_um(g, a, n):
    return ef_addmod(ef_mod(a, n), ef_negmod(ef_modu(g, n), n), n)


@triton.jit
def ef_u2f(g):
    return g.to(tl.float64) + tl.where(g < 0, 18446744073709551616.0, 0.0)


@triton.jit
def ef_wide_k(lo, f):
    return tl.floor((f - lo.to(tl.float64)) * 5.421010862427522e-20 + 0.5).to(tl.int64)


@triton.jit
def ef_sat_w(lo, f, n):
    k = ef_wide_k(lo, f)
    return tl.where((k < 0) | ((k == 0) & (lo < 0)), -1, tl.where((k > 0) | (lo >= n), n, lo))


@triton.jit
def ef_wrap_w(lo, f, n):
    k = ef_wide_k(lo, f)
    m = ef_mod(k, n)
    for _ in tl.static_range(4):   # k * 2**64 mod n, 16 bits at a time (n < 2**47)
        m = (m << 16) % tl.maximum(n, 1)
    return tl.where(k == 0, ef_mod(lo, n), ef_addmod(ef_mod(lo, n), m, n))


@triton.jit
def ef_max(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def ef_min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def ef_fold(s, c, x):
    # Neumaier: s + x, the rounding error added to c
    t = s + x
    return t, c + tl.where(tl.abs(s) >= tl.abs(x), (s - t) + x, (x - t) + s)


@triton.jit
def ef_total(s, c):
    # the compensated total, unless the sum is inf or NaN (then c means nothing)
    return tl.where((s - s) == 0, s + c, s)
'''


class ChunkedSums:
    """Mixed into TritonRenderer (``shape``, ``T``, ``stmt``, ``affine``, ``inline``,
    ``outer_accs``, ``redirect``, ``tile_partial``, ``reduction_depth``, ``nested_accs``
    come from there)."""

    def reduction_loop(self, node: ir.Loop, depth: int) -> List[str]:
        """A loop that is neither a row/lane loop, a tl.dot nor a vector loop."""
        pad = "    " * depth
        var, extent = name(node.var), self.affine(node.extent)
        tiles, sums = self.chunk_targets(node)
        self.reduction_depth += node.kind == LoopKind.REDUCTION
        plain = [f"{pad}for {var} in range(0, {extent}):"]
        for stmt in node.body:
            plain += self.stmt(stmt, depth + 1)
        if not (tiles or sums):
            self.reduction_depth -= node.kind == LoopKind.REDUCTION
            return plain
        # a short loop as it was, a long one in chunks, each into fresh partials folded
        # into the totals after it; under a vector loop always in chunks (each of its
        # steps runs this loop whole: its tiles' partials would take all its terms)
        lines, first, last = self.chunks(var, extent, "1", pad + "    ",
                                         [f"{acc}_p" for acc in sums])
        lines += [f"{pad}        {acc}_tq = tl.zeros([BLOCK, RB], {self.T})" for acc in tiles]
        lines.append(f"{pad}        for {var} in range({first}, {last}):")
        saved = dict(self.redirect), dict(self.tile_partial)
        self.redirect.update({acc: f"{acc}_p" for acc in sums})
        self.tile_partial.update({acc: "_tq" for acc in tiles})
        for stmt in node.body:
            lines += self.stmt(stmt, depth + 3)
        self.redirect, self.tile_partial = saved
        self.reduction_depth -= 1
        lines += [f"{pad}        {acc}, {acc}_e = ef_fold({acc}, {acc}_e, {acc}_p)"
                  for acc in sums]
        lines += [f"{pad}        {acc}_t, {acc}_te = ef_fold({acc}_t, {acc}_te, {acc}_tq)"
                  for acc in tiles]
        if tiles:   # inside a vector loop, whose chunks take RB * CHUNK of its own steps
            return [line[4:] for line in lines]
        return ([f"{pad}if {extent} <= {CHUNK_LIMIT}:"] + ["    " + line for line in plain] +
                [f"{pad}else:"] + lines)

    def chunk_targets(self, loop: ir.Loop):
        """(vector-loop tiles, accumulators) of sums that a reduction loop adds to itself
        (not through a loop of its own), declared outside it and not inside another
        reduction (a nested reduction is short, as a rule): what its chunks fold."""
        if loop.kind != LoopKind.REDUCTION:
            return [], []
        found, todo = [], list(loop.body)
        while todo:
            node = todo.pop(0)
            if isinstance(node, ir.Accumulate) and node.op == ReduceOp.SUM:
                found.append(name(node.name))
            elif isinstance(node, ir.Loop) and node.var in self.inline:
                todo.extend(node.body)
        inside = {name(n.name) for n in ir.walk(loop) if isinstance(n, ir.DeclareAcc)}
        found = [acc for acc in dict.fromkeys(found)
                 if acc not in inside and acc not in self.nested_accs]
        tiles = {name(acc) for acc in self.outer_accs}
        return [acc for acc in found if acc in tiles], [acc for acc in found if acc not in tiles]

    def chunks(self, var: str, extent: str, step: str, pad: str, partials, shape=None):
        """(lines, first, end) opening chunks of CHUNK steps of a loop over range(0,
        extent, step), each name in ``partials`` at 0 in each; the loop itself runs
        over range(first, end, step) inside.  The chunk variable is c + the loop's."""
        lines = [f"{pad}for c{var} in range(0, {extent}, {step} * {CHUNK}):"]
        lines += [f"{pad}    {partial} = tl.zeros({shape or self.shape}, {self.T})"
                  for partial in partials]
        return lines, f"c{var}", f"tl.minimum(c{var} + {step} * {CHUNK}, {extent})"
