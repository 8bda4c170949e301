"""Register-blocked contractions for the jit kernel renderer (``c_loops.py``).

A row reduction ``out[..., j] = sum_r x[..r..] * y[..r.., j]`` (a ``dot_general``
whose output's last axis is ``y``'s contiguous last axis) is, inside a loop kernel,
usually a short row: 32 outputs of a 32x32 layer.  The plain rendering keeps the row of
accumulators in a stack array, and GCC stores it back after every reduced index, so
each step of the sum waits for a store and a reload (about 10 cycles) instead of an
FMA (4).  Here the row is cut into groups of a few vectors of GCC/Clang
vector-extension type held in local variables (registers): per reduced index one
broadcast of ``x`` and one load and one multiply-add per vector.  Each output element
still sums its terms in the same order as the plain nest, so the result is unchanged;
the elements past the last whole vector are summed one by one the same way.  The one
exception: a single row too short to keep the FMA units busy (plan/jit_vectors.py's
``partial_sums``) sums in interleaved partial sums added at the end, a rounding
difference, because in a loop whose steps wait on that row the chain's length is the
step's time.

The vector width and the block sizes are the machine's (plan/jit_vectors.py): one
register per vector, the accumulators a fraction of the register file."""

from __future__ import annotations

from typing import Optional, Tuple

from ...ir import Apply, Assign, Cast, Expr, Index, Read, ReduceOp, ScalarType, Select
from ...plan.jit_vectors import jit_vectors
from .scalar_types import C_TYPE

# The vector width and the block (``group`` vectors along a row, ``rows`` rows,
# ``accumulators`` vectors in all) are the machine's, decided in plan/jit_vectors.py.
#
# A vector of y loaded once into a register serves every row of the block.  GCC folds
# the load into each row's multiply-add instead (one load per FMA: with 4 rows, 20 loads
# for 16 FMAs, and the loads, not the FMAs, set the pace: 82% of peak against 100% in a
# 32 x 32 layer on AVX-512); an empty asm statement that claims to change the register
# keeps the one load.  Only where the vector is one register ("v": any xmm/ymm/zmm).
KEEP_IN_REGISTER = ("#if defined(__x86_64__)\n"
                    "#define EF_IN_REGISTER(v) __asm__(\"\" : \"+v\"(v))\n"
                    "#else\n#define EF_IN_REGISTER(v) ((void)0)\n#endif")
NO_KEEP = "#define EF_IN_REGISTER(v) ((void)0)"


def mentions(node: Expr, name: str) -> bool:
    """Whether the index ``name`` appears anywhere in ``node``."""
    if isinstance(node, Index):
        return node.name == name
    if isinstance(node, Read):
        return any(mentions(s, name) for s in node.subscripts)
    if isinstance(node, Apply):
        return any(mentions(a, name) for a in node.args)
    if isinstance(node, Cast):
        return mentions(node.arg, name)
    if isinstance(node, Select):
        return mentions(node.which, name) or any(mentions(c, name) for c in node.cases)
    return False


def contraction_operands(step: Assign, dtype: ScalarType) -> Optional[Tuple[Expr, Read]]:
    """``(x, y)`` when ``step`` is ``out[..., j] = sum_r x * y`` with ``x`` free of
    ``j`` and ``y`` a read whose last subscript is ``j`` and no other mentions it;
    None for any other statement (it is rendered the plain way)."""
    reduction = step.reduction
    if reduction is None or reduction.op is not ReduceOp.SUM or not dtype.is_float \
            or not step.indices:
        return None
    body = reduction.body
    if not isinstance(body, Apply) or body.op != "mul" or body.dtype is not dtype:
        return None
    last = step.indices[-1][0]
    for x, y in (body.args, body.args[::-1]):
        if isinstance(y, Read) and y.dtype is dtype and y.subscripts and \
                y.subscripts[-1] == Index(last) and \
                not any(mentions(s, last) for s in y.subscripts[:-1]) and \
                not mentions(x, last):
            return x, y
    return None


def render_contraction(renderer, step: Assign, x: Expr, y: Read) -> None:
    """Emits the blocked loops for ``step`` (``contraction_operands`` matched it)."""
    dtype = renderer.program.buffer(step.buffer).dtype
    t = C_TYPE[dtype]
    shape = jit_vectors()
    lanes = shape.lanes(dtype.numpy.itemsize)
    vector = f"ef_vec_{t}"
    renderer.helpers.setdefault(
        vector, f"typedef {t} {vector} __attribute__((vector_size({shape.vector_bytes})));")
    renderer.helpers.setdefault("EF_IN_REGISTER",
                                KEEP_IN_REGISTER if shape.pin_loads else NO_KEEP)
    *outer, (last, extent) = step.indices
    whole = extent // lanes                       # whole vectors in the row
    # the output index before the row, when y does not read it (a batch of rows, as in
    # a vmapped layer): several rows at once, so each vector of y loaded serves them all
    row = None
    if outer and outer[-1][1] > 1 and not mentions(y, outer[-1][0]) and whole:
        row, rows = outer[-1]
        outer = outer[:-1]
    parallel = step.parallel
    # threads over the first loop of the nest: the row blocks when no loop is outside
    share_rows = row is not None and parallel and all(e == 1 for _, e in outer)
    opened = renderer.open_loops(outer, parallel=parallel and not share_rows)
    target = f"&{step.buffer}[" + renderer.offset(
        step.buffer, step.prefix + tuple(Index(n) for n, _ in step.indices)) + "]"
    source = f"&{y.buffer}[{renderer.offset(y.buffer, y.subscripts)}]"
    group = shape.group if row is not None else shape.row_group
    groups = [(start, min(group, whole - start)) for start in range(0, whole, group)]
    # the groups of ``group`` vectors as one C loop, a shorter last group after it
    shapes = []
    if any(g[1] == group for g in groups):
        shapes.append((f"ef_g * {group * lanes}LL", sum(g[1] == group for g in groups), group))
    if groups and groups[-1][1] != group:
        shapes.append((f"{groups[-1][0] * lanes}LL", 1, groups[-1][1]))
    for start, repeat, count in shapes:
        if row is None:
            _block(renderer, step, x, t, vector, lanes, last, start, repeat, count,
                   None, 1, source, target)
            continue
        per_block = max(1, min(shape.rows, shape.accumulators // count, rows))
        blocks, left = divmod(rows, per_block)
        if share_rows and blocks >= 2:
            renderer.emit("#pragma omp parallel for")
        renderer.emit(f"for (long long ef_r = 0; ef_r < {blocks * per_block}LL; "
                      f"ef_r += {per_block}LL) {{")
        renderer.depth += 1
        _block(renderer, step, x, t, vector, lanes, last, start, repeat, count, row,
               per_block, source, target)
        renderer.depth -= 1
        renderer.emit("}")
        if left:
            renderer.emit("{")
            renderer.depth += 1
            renderer.emit(f"const long long ef_r = {blocks * per_block}LL;")
            _block(renderer, step, x, t, vector, lanes, last, start, repeat, count, row,
                   left, source, target)
            renderer.depth -= 1
            renderer.emit("}")
    if whole * lanes < extent:
        if row is not None:
            opened += renderer.open_loops([(row, rows)])
        _rest(renderer, step, x, y, dtype, t, last, extent, whole * lanes, source, target)
    renderer.close(opened)


def _block(renderer, step, x, t, vector, lanes, last, start, repeat, count, row,
           rows, source, target) -> None:
    """``rows`` rows (from ``ef_r``; one row and no index when ``row`` is None) by
    ``count`` vectors of the row (from ``start``), ``repeat`` times along the row."""
    renderer.emit(f"for (long long ef_g = 0; ef_g < {repeat}LL; ++ef_g) {{")
    renderer.depth += 1
    renderer.emit(f"const long long {last} = {start};")
    reduced = step.reduction.indices
    split = jit_vectors().partial_sums(count, reduced[-1][1]) if row is None and reduced else 1
    if split > 1:
        _split_row(renderer, step, x, t, vector, lanes, count, split, source, target)
        renderer.depth -= 1
        renderer.emit("}")
        return
    for r in range(rows):
        renderer.emit(" ".join(f"{vector} ef_a{r}_{k} = {{0}};" for k in range(count)))
    inner = renderer.open_loops(step.reduction.indices)
    for r in range(rows):
        renderer.emit(f"{t} ef_x{r};")
        _at_row(renderer, row, r, f"ef_x{r} = {renderer.expr(x)};")
    renderer.emit(f"const {t} *ef_y = {source};")
    for k in range(count):
        keep = " EF_IN_REGISTER(ef_v);" if rows > 1 else ""
        renderer.emit(f"{{ {vector} ef_v; memcpy(&ef_v, ef_y + {k * lanes}, sizeof ef_v);{keep} " +
                      " ".join(f"ef_a{r}_{k} += ef_x{r} * ef_v;" for r in range(rows)) + " }")
    renderer.close(inner)
    for r in range(rows):
        stores = " ".join(f"memcpy(ef_out + {k * lanes}, &ef_a{r}_{k}, sizeof ef_a{r}_{k});"
                          for k in range(count))
        _at_row(renderer, row, r, f"{t} *ef_out = {target}; {stores}")
    renderer.depth -= 1
    renderer.emit("}")


def _split_row(renderer, step, x, t, vector, lanes, count, split, source, target) -> None:
    """One row of ``count`` vectors summed as ``split`` interleaved partial sums along
    the last reduced index (terms ``split * q + p`` in sum ``p``), then added in order:
    ``split`` times the independent chains of the plain block."""
    *outer, (index, extent) = step.reduction.indices
    for p in range(split):
        renderer.emit(" ".join(f"{vector} ef_a{p}_{k} = {{0}};" for k in range(count)))
    opened = renderer.open_loops(outer)
    whole = extent // split * split

    def terms(parts: int) -> None:
        for p in range(parts):
            renderer.emit(f"{{ const long long {index} = ef_q + {p}LL; "
                          f"const {t} ef_x = {renderer.expr(x)}; const {t} *ef_y = {source};")
            for k in range(count):
                renderer.emit(f"  {{ {vector} ef_v; memcpy(&ef_v, ef_y + {k * lanes}, "
                              f"sizeof ef_v); ef_a{p}_{k} += ef_x * ef_v; }}")
            renderer.emit("}")
    renderer.emit(f"for (long long ef_q = 0; ef_q < {whole}LL; ef_q += {split}LL) {{")
    terms(split)
    renderer.emit("}")
    if whole < extent:
        renderer.emit("{")
        renderer.emit(f"const long long ef_q = {whole}LL;")
        terms(extent - whole)
        renderer.emit("}")
    renderer.close(opened)
    for k in range(count):
        renderer.emit(f"ef_a0_{k} = " + " + ".join(f"ef_a{p}_{k}" for p in range(split)) + ";")
    stores = " ".join(f"memcpy(ef_out + {k * lanes}, &ef_a0_{k}, sizeof ef_a0_{k});"
                      for k in range(count))
    renderer.emit(f"{{ {t} *ef_out = {target}; {stores} }}")


def _at_row(renderer, row, r: int, statement: str) -> None:
    """``statement`` with the row index ``row`` at ``ef_r + r`` (as is without a row)."""
    if row is None:
        renderer.emit(statement if statement.startswith("ef_") else f"{{ {statement} }}")
    else:
        renderer.emit(f"{{ const long long {row} = ef_r + {r}LL; {statement} }}")


def _rest(renderer, step, x, y, dtype, t, last, extent, start, source, target) -> None:
    """The row's elements past its last whole vector: narrower vectors (12 = 8 + 4
    doubles), then one accumulator each, every element summed in the same order."""
    widest = jit_vectors().vector_bytes
    for width in (widest // 2, widest // 4):
        narrow = width // dtype.numpy.itemsize
        if narrow < 2 or extent - start < narrow:
            continue
        short = f"ef_vec{width}_{t}"
        renderer.helpers.setdefault(
            short, f"typedef {t} {short} __attribute__((vector_size({width})));")
        renderer.emit("{")
        renderer.depth += 1
        renderer.emit(f"const long long {last} = {start}LL;")
        renderer.emit(f"{short} ef_a = {{0}};")
        inner = renderer.open_loops(step.reduction.indices)
        renderer.emit(f"const {t} ef_x = {renderer.expr(x)};")
        renderer.emit(f"{short} ef_v; memcpy(&ef_v, {source}, sizeof ef_v); "
                      "ef_a += ef_x * ef_v;")
        renderer.close(inner)
        renderer.emit(f"memcpy({target}, &ef_a, sizeof ef_a);")
        renderer.depth -= 1
        renderer.emit("}")
        start += narrow
    if start < extent:
        renderer.emit(f"for (long long {last} = {start}LL; {last} < {extent}LL; "
                      f"++{last}) {{")
        renderer.depth += 1
        renderer.emit(f"{t} ef_acc = 0;")
        inner = renderer.open_loops(step.reduction.indices)
        renderer.emit(f"ef_acc += {renderer.expr(x)} * {renderer.expr(y)};")
        renderer.close(inner)
        renderer.emit(f"*({target}) = ef_acc;")
        renderer.depth -= 1
        renderer.emit("}")
