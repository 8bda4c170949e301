"""C helpers for the elementwise functions and operators whose C spelling is not one libm
call: ``sign``, and Python's ``//`` and ``%`` (NumPy's floor_divide and remainder),
for backends/c/render.py.

* Floats follow NumPy's ``npy_divmod`` step by step: the exact ``fmod``, the quotient
  ``(a - mod) / b`` snapped to an integer, the signs of zero results from ``a / b``
  (``//``) and ``b`` (``%``); a zero divisor gives ``a / b`` (inf or NaN) for ``//`` and
  NaN for ``%``.  (The statement is compiled without -freciprocal-math, which would turn
  the division into a product with 1/b: see plan/lower.py ``_fast_math_safe``.)
* Signed integers floor, where C's ``/`` and ``%`` truncate toward zero; a zero divisor
  gives 0, as NumPy does (it also warns); ``MIN // -1`` wraps to ``MIN`` as in NumPy,
  without the division that would trap (and ``MIN % -1`` is 0).
* ``sign`` is NumPy's: -1, 0 or 1 in the working dtype, +0 for both zeros, NaN for NaN.

``T`` is the working dtype's C type (c_render's prelude defines it).
"""

from ...ir import BinaryOp

_FLOAT = """\
/* NumPy's floor_divide and remainder (npy_divmod): Python's // and % */
static inline T ef_floordiv(T a, T b) {{
  if (b == 0) return a / b;
  T mod = fmod{f}(a, b), div = (a - mod) / b, fl;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= (T)1;
  if (div == 0) return copysign{f}((T)0, a / b);
  fl = floor{f}(div);
  return (div - fl > (T)0.5) ? fl + (T)1 : fl;
}}
static inline T ef_pymod(T a, T b) {{
  T mod = fmod{f}(a, b);
  if (b == 0) return mod;
  if (mod != 0) return ((b < 0) != (mod < 0)) ? mod + b : mod;
  return copysign{f}((T)0, b);
}}
static inline T ef_sign(T a) {{ return a > 0 ? (T)1 : (a < 0 ? (T)-1 : (a == a ? (T)0 : a)); }}
"""

_SIGNED = """\
/* Python's // and % on integers: floored, x // 0 = x % 0 = 0 as NumPy, MIN // -1 wraps */
static inline T ef_floordiv(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return (T)(0 - (uint64_t)a);
  T q = (T)(a / b), r = (T)(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q;
}
static inline T ef_pymod(T a, T b) {
  if (b == 0 || b == -1) return 0;
  T r = (T)(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
static inline T ef_sign(T a) { return (T)((a > 0) - (a < 0)); }
"""

_UNSIGNED = """\
/* // and % on unsigned integers: C's own, with x // 0 = x % 0 = 0 as NumPy */
static inline T ef_floordiv(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }
static inline T ef_pymod(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }
static inline T ef_sign(T a) { return (T)(a > 0); }
"""

# the ast operator / function -> the helper that computes it
OPERATORS = {BinaryOp.FLOOR_DIV: "ef_floordiv", BinaryOp.MOD: "ef_pymod"}


def elementwise_helpers(working: str) -> str:
    """The helpers' C text for the working dtype's name (``float32``, ``int8`` ...)."""
    if working.startswith("float"):
        return _FLOAT.format(f="f" if working == "float32" else "")
    return _UNSIGNED if working.startswith("uint") else _SIGNED
