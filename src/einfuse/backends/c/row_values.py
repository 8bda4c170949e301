"""C source of the log-sum-exp row kernel for one group (plan/row_statistics.py decides
what it computes): each row's maximum M and sum of shifted exponentials S, as
the softmax kernel finds them (rows_source.py: one read of the row from memory, the sum from
the L1 cache), then every member's value for that row, printed here from the group's
value trees -- while the row is still in the cache, so that a label's logit
``X[i, t[i]]`` costs a load, and with no per-call work but the kernel call.

The kernel's buffers are the matrix, the members' outputs (one value per row each, or
a whole row for a member over [i, j] -- a log-softmax --, in the members' order), then the other inputs in ``RowStatistics.inputs`` order (values
in the working type, index arrays as int64); its ints are the rows, the row length,
the matrix's row stride, then per other input its shape and strides (in elements).
A gathered index outside its axis sets the error flag (the row's values are not
written): the caller then declines the run and the statements name the value.

Functions are the C library's (``expf``, ``logf`` ...: the generic kernel's own), a
``logsumexp`` is ``M + log(S)`` where M is finite and M where it is not (the running
maximum's value for a row of -inf, a row holding inf, a NaN)."""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np

from ...plan.row_statistics import (Apply, Column, ColumnIndex, Const, MemberValue, Read,
                                    RowPick, Rows, RowStatistics, RowSum, Stat, Subscript,
                                    Total)
from . import build as c_build
from .rows_source import source as rows_source

FUNCTION = "ef_lse_values_call"
_FUNCTIONS = {"exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1",
              "sqrt": "sqrt", "abs": "fabs", "tanh": "tanh"}
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")
_EXPONENTIAL = Apply("exp", (Column(),))

_KERNEL = r"""
/* bufs: X, the members' outputs, the other inputs; ints: rows, n, ldx, then per other
   input its shape and strides */
void %(name)s(void **bufs, const int64_t *ints, const double *dprm,
              const int64_t *iprm, const double *fills, int nthreads, int32_t *err) {
  (void)dprm; (void)iprm; (void)fills;
  const T *X = (const T *)bufs[0];
  const int64_t rows = ints[0], n = ints[1], ldx = ints[2];
%(declarations)s
  const int nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  int32_t bad = 0;
%(total_declarations)s
  #pragma omp parallel num_threads(nth) reduction(|:bad)
  {
    const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
%(thread_total)s
    const int64_t lo = rows / parts * part + (part < rows %% parts ? part : rows %% parts);
    const int64_t hi = lo + rows / parts + (part < rows %% parts);
%(thread_statistics)s
%(thread_rows)s
    for (int64_t i = lo; i < hi; ++i) {
      const T *x = X + i * ldx;
%(statistics)s
%(body)s
    }
%(thread_end)s
%(thread_rows_end)s
  }
  if (bad) *err = 1;
%(total_end)s
}
"""
# a scalar statement's sum over the rows: per thread a compensated double sum of its
# rows' values (Neumaier), the threads' sums then added in thread order
_TOTAL = {
    "total_declarations": "  double *totals = (double *)calloc(2 * (size_t)nth, sizeof(double));\n"
                          "  if (!totals) { *err = 2; return; }",
    "thread_total": "    double sum = 0, error = 0;",
    "thread_end": "    totals[2 * part] = sum; totals[2 * part + 1] = error;",
    "total_end": "  double sum = 0, error = 0;\n"
                 "  for (int p = 0; p < nth; ++p) { ef_fold_double(&sum, &error, totals[2 * p]);"
                 " error += totals[2 * p + 1]; }\n"
                 "  free(totals);\n"
                 "  const double total = isfinite(sum) ? sum + error : sum;\n"
                 "  O0[0] = (T)(%(value)s);",
}
# the row's range was found with the previous row's exponentials (rows_source.ef_exp_next)
_THREAD_STATISTICS = r"""    T next = 0, next_low = 0;
    if (lo < hi) next = ef_row_range(X + lo * ldx, n, &next_low);"""
_STATISTICS = r"""      T m = next;
      const T low = next_low;
      const T s = ef_exp_next(X, (T *)x, i, hi, ldx, n, &m, low, 0, &next, &next_low, 0);
      const T lse = isfinite(m) ? m + EF_FN(log)(s) : m;
      (void)lse; (void)low;"""
_PER_ROW = {"total_declarations": "", "thread_total": "", "thread_end": "", "total_end": ""}
# a member over [i, j] writes its rows past the caches where they are large
# (row_streams.ef_streams): a short row's values go to a buffer of the thread's (in the L1
# cache), then streamed to the output
_THREAD_ROWS = r"""    T row_buffer[EF_SHORT / sizeof(T)] __attribute__((aligned(64)));
    const int stream = n * (int64_t)sizeof(T) <= EF_SHORT && ef_streams(rows, n);"""
_THREAD_ROWS_END = "    if (stream) ef_stream_fence();"
# one such member, with the row statistics: its row is streamed out by the next row's
# exponentials (rows_source.ef_exp_next, row_streams.ef_out: two buffers), not in a burst
# after its own (which stalled the row until its lines went out)
_THREAD_DEFERRED = r"""    T row_buffers[2][EF_SHORT / sizeof(T)] __attribute__((aligned(64)));
    const int stream = n * (int64_t)sizeof(T) <= EF_SHORT && ef_streams(rows, n);
    ef_out pending = {row_buffers[0], O%(k)d, {}, n, n};     /* nothing to write yet */"""
_THREAD_DEFERRED_END = """    if (stream) {
      ef_out_finish(&pending);
      ef_stream_fence();
    }"""
_FOLD = r"""
#include <stdlib.h>
static inline void ef_fold_double(double *s, double *c, double x) {
  double t = *s + x;
  *c += fabs(*s) >= fabs(x) ? (*s - t) + x : (x - t) + *s;
  *s = t;
}
"""


def values_source(statistics: RowStatistics, dtype: np.dtype, vector_bytes: int) -> str:
    """The row kernels' source with this group's kernel (FUNCTION) added; where a row
    sum calls a function, libmvec's vector versions are declared for its SIMD loop (as
    the generic kernel calls them), and only then (the other members' bits stay)."""
    printer = _Printer(statistics)
    kernel = printer.kernel()
    declarations = ""
    if printer.sum_functions and c_build.vector_math():
        declarations = c_build.vector_math_declarations("f", "float") if \
            dtype == np.float32 else c_build.vector_math_declarations("", "double")
    return rows_source(dtype, vector_bytes) + _FOLD + declarations + kernel


def ints_of(statistics: RowStatistics, inputs) -> np.ndarray:
    """The kernel's ints for the matrix and the other inputs (``inputs``, the matrix
    first, as the kernel takes them: RowStatistics.inputs' order)."""
    x = inputs[0]
    ints = [x.shape[0], x.shape[1], x.strides[0] // x.itemsize]
    for array in inputs[1:]:
        ints += list(array.shape) + [s // array.itemsize for s in array.strides]
    return np.array(ints, dtype=np.int64)


def kernel_inputs(statistics: RowStatistics, arrays, working: np.dtype):
    """The other inputs in the kernel's types (values in ``working``, index arrays as
    int64), each with strides a whole number of elements."""
    found = []
    for key in statistics.inputs:
        target = np.dtype(np.int64) if key in statistics.index_keys else working
        array = np.asarray(arrays[key]).astype(target, copy=False)
        if any(s % array.itemsize for s in array.strides):
            array = np.ascontiguousarray(array)
        found.append(array)
    return found


class _Printer:
    def __init__(self, statistics: RowStatistics):
        self.statistics = statistics
        self.members = len(statistics.values)
        self.reads: Dict[Read, str] = {}
        self.sums: Dict[RowSum, str] = {}
        self.sum_functions = False      # whether a SIMD loop (a row sum, a row of values)
        #                                 calls a function
        self.lines: List[str] = []

    def kernel(self) -> str:
        declarations = [f"  T *O{k} = (T *)bufs[{1 + k}];" for k in range(self.members)]
        offset = 3
        self.layout: Dict[str, Tuple[str, int, int]] = {}
        for number, key in enumerate(self.statistics.inputs):
            ndim = self.statistics.ndims[key]
            ctype = "int64_t" if key in self.statistics.index_keys else "T"
            declarations.append(f"  const {ctype} *A{number} = (const {ctype} *)"
                                f"bufs[{1 + self.members + number}];")
            self.layout[key] = (f"A{number}", offset, ndim)
            offset += 2 * ndim
        grid = self.statistics.grid or (False,) * self.members
        deferred = bool(self.statistics.maximum) and sum(grid) == 1
        loops = []
        for k, value in enumerate(self.statistics.values):
            if grid[k]:     # a row of values over the columns, from x[c] (in the cache)
                buffer = "row_buffers[(i - lo) & 1]" if deferred else "row_buffer"
                written = (f"pending = ef_out_start(out, O{k} + i * n, (T)1, n);" if deferred
                           else f"ef_stream_copy(O{k} + i * n, row_buffer, n);")
                element = self.value(value)
                # a row of values that calls a function (softmax's exp(x - m) / s
                # written with its normaliser inline) as a SIMD loop, through
                # libmvec's vector functions as the generic kernel and the row sums
                # call them: one scalar exp a column was 5.3 ms of a 2048 x 1024 float32
                # softmax that the softmax kernel runs in 0.6
                simd = "EF_FN(" in element and c_build.vector_math()
                self.sum_functions |= simd
                loops += ["      {",
                          f"        T *out = stream ? {buffer} : O{k} + i * n;",
                          *(["        #pragma omp simd"] if simd else []),
                          "        for (int64_t c = 0; c < n; ++c) {",
                          "          const T xc = x[c];",
                          f"          out[c] = (T)({element});",
                          "        }",
                          f"        if (stream) {written}",
                          "      }"]
            else:
                self.lines.append(f"      const T v{k} = (T)({self.value(value)});")
        body = list(self.lines)
        parts = dict(_PER_ROW)
        if self.statistics.total is None:
            body += [f"      O{k}[i] = v{k};" for k in range(self.members) if not grid[k]]
            body += loops
        else:       # (one member: the summand)
            body.append("      ef_fold_double(&sum, &error, (double)v0);")
            parts = dict(_TOTAL)
            parts["total_end"] = parts["total_end"] % {
                "value": self.value(self.statistics.total)}
        statistics = _STATISTICS if self.statistics.maximum else ""
        thread_rows, thread_rows_end = (_THREAD_ROWS, _THREAD_ROWS_END) if loops else ("", "")
        if deferred:
            statistics = statistics.replace("&next_low, 0);", "&next_low,\n"
                                            "                              stream ? &pending : 0);")
            statistics += "\n      if (stream) ef_out_finish(&pending);"
            thread_rows = _THREAD_DEFERRED % {"k": grid.index(True)}
            thread_rows_end = _THREAD_DEFERRED_END
        return _KERNEL % dict(parts, name=FUNCTION, declarations="\n".join(declarations),
                              body="\n".join(body), statistics=statistics,
                              thread_statistics=_THREAD_STATISTICS
                              if self.statistics.maximum else "",
                              thread_rows=thread_rows, thread_rows_end=thread_rows_end)

    def value(self, node) -> str:
        if isinstance(node, Const):
            return _literal(node.value)
        if isinstance(node, Total):
            return "total"
        if isinstance(node, Rows):
            return "(double)rows"
        if isinstance(node, Column):
            return "xc"
        if isinstance(node, ColumnIndex):
            return "(T)j"
        if isinstance(node, RowSum):
            return self.row_sum(node)
        if isinstance(node, RowPick):
            return self.row_pick(node)
        if isinstance(node, Stat):
            return {"max": "m", "sum": "s", "logsumexp": "lse"}[node.name]
        if isinstance(node, MemberValue):
            return f"v{node.number}"
        if isinstance(node, Read):
            return self.read(node)
        args = [self.value(a) for a in node.args]
        op = node.op
        if op == "where":
            return f"(({args[0]}) ? (T)({args[1]}) : (T)({args[2]}))"
        if op == "neg":
            return f"(-({args[0]}))"
        if op == "square":
            return f"ef_square((T)({args[0]}))"
        if op in ("&", "|"):
            return f"((({args[0]}) != 0) {op} (({args[1]}) != 0))"
        if op in _COMPARE or op in "+-*/":
            return f"(({args[0]}) {op} ({args[1]}))"
        return f"EF_FN({_FUNCTIONS[op]})((T)({args[0]}))"

    def row_sum(self, node: RowSum) -> str:
        """A local holding the row's sum of ``node.body`` (its per-row reads printed
        first, before the loop over the columns)."""
        found = self.sums.get(node)
        if found is not None:
            return found
        name = f"q{len(self.sums)}"
        if node.body == _EXPONENTIAL:
            # the row's sum of exp(x - 0) = exp(x) (NaN, infinities and -0.0 alike):
            # the softmax kernel's vector exponentials, summed compensated.  Where the
            # row's extremes put every x in the fast exponential's range (the same bits
            # there as the full one: rows_source.ef_vexp_fast) it is taken, as the
            # shifted rows take it: the range pass reads the row from memory, the
            # exponentials then run in the L1 cache (the quotient cross-entropy 2048 x
            # 1024 float32: 1.12 -> 0.85 ms)
            self.lines += [
                f"      T {name}lo = 0;",
                f"      const T {name}top = ef_row_range(x, n, &{name}lo);",
                f"      const T {name} = ef_exp_row(x, (T *)x, n, (T)0, "
                f"ef_fast_unshifted({name}top, {name}lo), "
                "ef_ahead_row(X, i, hi, ldx, n), 0);"]
            self.sums[node] = name
            return name
        body = self.value(node.body)
        self.sum_functions |= "EF_FN(" in body
        self.lines += [
            f"      double {name}d = 0;",
            f"      #pragma omp simd reduction(+:{name}d)",
            "      for (int64_t j = 0; j < n; ++j) {",
            "        const T xc = x[j];",
            f"        {name}d += (double)(T)({body});",
            "      }",
            f"      const T {name} = (T){name}d;"]
        self.sums[node] = name
        return name

    def row_pick(self, node: RowPick) -> str:
        """A local holding ``0.0 + value`` at the column ``at`` names, 0.0 where it names
        none.  The written comparison is ``(T)j == at``: a column names it where ``at``
        is a whole number in [0, n) -- and only one where every column index is exact in
        T (n <= 2**24 for float): longer rows sum as written."""
        found = self.sums.get(node)
        if found is not None:
            return found
        at = self.value(node.at)
        name = f"q{len(self.sums)}"
        value = self.value(node.value)
        # the written summand, for the rows the pick does not take
        written = f"(T)({value}) * (T)((T)j == {name}a)" if node.dense else \
            f"(((T)j == {name}a) ? (T)({value}) : (T)0)"
        # a finite row (its maximum and minimum finite: a NaN's row maximum is NaN)
        # adds ±0.0 at the other columns of a one-hot product
        long_row = "n > (sizeof(T) == 4 ? ((int64_t)1 << 24) : ((int64_t)1 << 53))"
        unpicked = f"{long_row} || !(isfinite(m) && isfinite(low))" if node.dense \
            else long_row
        self.lines += [
            f"      const T {name}a = (T)({at});",
            f"      T {name};",
            f"      if ({unpicked}) {{",
            f"        double {name}d = 0;",
            "        for (int64_t j = 0; j < n; ++j) {",
            "          const T xc = x[j]; (void)xc;",
            f"          {name}d += (double)({written});",
            "        }",
            f"        {name} = (T){name}d;",
            f"      }} else if ({name}a >= 0 && {name}a < (T)n && "
            f"{name}a == (T)(int64_t){name}a) {{",
            f"        const int64_t j = (int64_t){name}a; const T xc = x[j]; (void)xc;",
            f"        {name} = (T)0 + (T)({value});",
            "      } else {",
            f"        {name} = 0;",
            "      }"]
        self.sums[node] = name
        return name

    def read(self, read: Read) -> str:
        """A local holding the read's value in this row (its subscripts checked first:
        out of its axis, the row's values are skipped and the flag raised)."""
        found = self.reads.get(read)
        if found is not None:
            return found
        if read.key == self.statistics.matrix:
            pointer, extents, strides = "X", ["rows", "n"], ["ldx", "1"]
            ctype = "T"
        else:
            pointer, offset, ndim = self.layout[read.key]
            extents = [f"ints[{offset + a}]" for a in range(ndim)]
            strides = [f"ints[{offset + ndim + a}]" for a in range(ndim)]
            ctype = "int64_t" if read.key in self.statistics.index_keys else "T"
        positions = [self.subscript(s) for s in read.subscripts]   # (its gathers first)
        name = f"r{len(self.reads)}"
        terms = []
        for axis, value in enumerate(positions):
            position = f"{name}_{axis}"
            self.lines.append(f"      const int64_t {position} = {value};")
            self.lines.append(f"      if ((uint64_t){position} >= (uint64_t){extents[axis]})"
                              " { bad = 1; continue; }")
            terms.append(f"{position} * {strides[axis]}")
        self.lines.append(f"      const {ctype} {name} = {pointer}[{' + '.join(terms) or '0'}];")
        self.reads[read] = name
        return name

    def subscript(self, subscript: Subscript) -> str:
        parts = [f"(int64_t){subscript.constant}"]
        if subscript.row:
            parts.append(f"(int64_t){subscript.row} * i")
        for read, coefficient in subscript.gathers:
            parts.append(f"(int64_t){coefficient} * {self.read(read)}")
        return " + ".join(parts)


def _literal(value: float) -> str:
    if math.isnan(value):
        return "(T)NAN"
    if math.isinf(value):
        return "(T)INFINITY" if value > 0 else "(-(T)INFINITY)"
    return f"(T){float(value).hex()}"
