"""The C text of the jit renderer's vector math functions (backends/c/loops_vmath.py):
``exp``, ``tanh`` and ``logistic`` of one vector register of float32 or float64, in
GCC vector-extension code of the width plan/jit_vectors.py chose.

Two ways to ``exp``:

* **table** (64-byte vectors only, the AVX-512 logistic): ``e = exp(-|x|)`` by a
  16-entry table of ``2^(j/16)`` held in two registers (one permute, not a gather), a
  degree-6 polynomial (float: 3) on ``|r| <= ln 2 / 32`` and the power of two added to
  the exponent bits.
* **polynomial** (any width, no table: AVX2 has no in-register permute of 16 doubles
  and a gather costs more than the longer polynomial): ``x = n ln 2 + r`` with
  ``|r| <= ln 2 / 2`` (``ln 2`` split in two so that ``n ln 2`` loses nothing), then
  ``exp(r) - 1 = r + r^2/2 + ... + r^13/13!`` (float: to ``r^7/7!``; the truncation
  error is below 0.1 ulp on that interval) by Estrin's scheme, and ``2^n`` built in the
  exponent bits.  Estrin's scheme, not Horner's rule: the same number of multiply-adds,
  but 4 of them deep instead of 11 (float: 3, not 5), and in a loop whose steps depend
  on each other (an RNN cell, the unbatched seed) that latency is the step's.

From that core (largest errors measured against the exact value on 2001 arguments,
float64/float32, the same on AVX2 and AVX-512: exp 0.92/0.91 ulp, tanh 2.1/2.5,
logistic 1.7/1.4, its table form 2.3/1.8):

* ``exp(x) = 2^n (1 + p)``, the power of two applied in two halves so that results
  in the subnormal range round once and large ones overflow to ``inf``;
* ``tanh(x) = sign(x) * -t / (2 + t)`` with ``t = expm1(-2|x|) = 2^n p + (2^n - 1)``
  (no cancellation for small ``|x|``: there ``n = 0`` and ``t = p``); ``|x|`` past 20
  (float: 10) gives 1 exactly, ``-0.0`` gives ``-0.0``;
* ``logistic(x) = 1 / (1 + e)`` or ``e / (1 + e)`` with ``e = exp(-|x|)`` (``e`` never
  overflows); results below 2^-1021 (float: 2^-125) are 0, the scalar formula's
  subnormal results included.

NaN gives the same NaN in all three.  Bounds checked by tests/test_jit_vmath.py against
NumPy's long double on both vector widths: exp 2 ulp, tanh and logistic 4 ulp."""

from __future__ import annotations

from typing import Tuple

from ...ir import ScalarType
from .scalar_types import C_TYPE

FUNCTIONS = ("exp", "tanh", "logistic")


class _Type:
    """The literals and integer types of one float type's vector code."""

    def __init__(self, dtype: ScalarType):
        double = dtype is ScalarType.FLOAT64
        self.suffix = "d" if double else "f"
        self.t = C_TYPE[dtype]
        self.dot = ".0" if double else ".0f"           # makes an integer literal this type
        self.v = f"ef_vec_{self.t}"
        self.u = "ef_vec_u64" if double else "ef_vec_u32"
        self.i = "ef_vec_i64" if double else "ef_vec_i32"
        self.int_c = "long long" if double else "int"
        self.mantissa = 52 if double else 23
        self.bias = 1023 if double else 127
        self.sign = "0x8000000000000000ULL" if double else "0x80000000U"
        self.shift = "0x1.8p52" if double else "0x1.8p23f"
        self.inv_ln2 = "0x1.71547652b82fep+0" if double else "0x1.715476p+0f"
        # ln 2 = hi + lo, hi with trailing zero bits: n * hi is exact for the n used here
        self.ln2_hi = "0x1.62e42fee00000p-1" if double else "0x1.62e4p-1f"
        self.ln2_lo = "0x1.a39ef35793c76p-33" if double else "0x1.7f7d1cp-20f"
        # 1/k!, k = 2..13 (float: 2..7): the Taylor series of exp(r) - 1 - r over r^2
        self.taylor = (
            ("0x1p-1", "0x1.5555555555555p-3", "0x1.5555555555555p-5",
             "0x1.1111111111111p-7", "0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-13",
             "0x1.a01a01a01a01ap-16", "0x1.71de3a556c734p-19", "0x1.27e4fb7789f5cp-22",
             "0x1.ae64567f544e4p-26", "0x1.1eed8eff8d898p-29", "0x1.6124613a86d09p-33")
            if double else
            ("0x1p-1f", "0x1.555556p-3f", "0x1.555556p-5f", "0x1.111112p-7f",
             "0x1.6c16c2p-10f", "0x1.a01a02p-13f"))
        # exp: arguments clamped to [low, high] keep n in range (-1076..1024: each half
        # of 2^n normal); below low the result is 0, above high inf either way
        self.exp_low, self.exp_high = ("-746.0", "710.0") if double else ("-104.0f", "89.0f")
        self.half_offset = 2048 if double else 256       # keeps (n + offset) >= 0
        # tanh: |x| past this rounds to 1; logistic: -|x| below this gives 0
        self.tanh_one = "20.0" if double else "10.0f"
        self.logistic_low = "-708.0" if double else "-87.0f"

    def splat(self, literal: str) -> str:
        return f"(({self.v}){{0}} + {literal})"


def typedefs(dtype: ScalarType, vector_bytes: int) -> str:
    """The vector types the functions of ``dtype`` use (repeating a typedef with the
    same type is allowed in C11, and loops_dot.py declares ``ef_vec_<t>`` too)."""
    k = _Type(dtype)
    size = f"__attribute__((vector_size({vector_bytes})))"
    return "\n".join([f"typedef {k.t} {k.v} {size};",
                      f"typedef unsigned {k.int_c} {k.u} {size};",
                      f"typedef {k.int_c} {k.i} {size};"])


def _select(k: _Type, mask: str, yes: str, no: str) -> str:
    """``mask ? yes : no`` lane by lane (``mask`` an integer vector of all-ones/zeros)."""
    return f"({k.v})(({mask} & ({k.u})({yes})) | (~{mask} & ({k.u})({no})))"


def _reduction(k: _Type, argument: str) -> str:
    """C statements setting ``z`` (n in its low bits), ``n``, ``r`` and ``p = exp(r) - 1``
    for ``argument = n ln 2 + r``, and ``ni``, n as an integer vector."""
    powers = len(k.taylor).bit_length() - 1          # r^2, r^4 (, r^8) are needed
    squares = [f"    {k.v} r2 = r * r;"] + [f"    {k.v} r{2 << j} = r{1 << j} * r{1 << j};"
                                             for j in range(1, powers)]
    return "\n".join([
        f"    const {k.v} shift = {k.splat(k.shift)};",
        f"    {k.v} z = {argument} * {k.inv_ln2} + shift;          /* n = round(x / ln 2) */",
        f"    {k.v} n = z - shift;",
        f"    {k.v} r = {argument} - n * {k.ln2_hi};",
        "    r = r - n * " + k.ln2_lo + ";",
        *squares,
        f"    {k.v} p = {_estrin(k.taylor)};",
        "    p = p * r2 + r;                                  /* exp(r) - 1 */",
        f"    {k.i} ni = ({k.i})z - ({k.i})shift;"])


def _estrin(coefficients, power: int = 1) -> str:
    """``c0 + c1 r + c2 r^2 + ...`` as a C expression of the variables ``r``, ``r2``,
    ``r4``, ``r8``: the low half plus the high half times the power of ``r`` that
    splits them, each half the same way (a tree of multiply-adds)."""
    if len(coefficients) == 1:
        return coefficients[0]
    split = 1 << (len(coefficients) - 1).bit_length() - 1
    name = "r" if split == 1 else f"r{split}"
    low = _estrin(coefficients[:split])
    return f"({low} + {name} * {_estrin(coefficients[split:])})"


def _pow2(k: _Type, exponent: str) -> str:
    """2^exponent for an integer vector in the normal range."""
    return f"({k.v})(({k.u})({exponent} + {k.bias}) << {k.mantissa})"


def _exp(k: _Type) -> str:
    return "\n".join([
        f"static inline {k.v} ef_vexp_{k.suffix}({k.v} a) {{",
        f"    {k.u} low = ({k.u})(a < {k.exp_low}), high = ({k.u})(a > {k.exp_high});",
        f"    {k.v} m = {_select(k, 'low', k.splat(k.exp_low), 'a')};",
        f"    m = {_select(k, 'high', k.splat(k.exp_high), 'm')};",
        _reduction(k, "m"),
        # 2^n as 2^n1 * 2^n2, n1 = floor(n / 2): both halves normal; the second product
        # rounds once, into the subnormals or to inf where the result lies there
        f"    {k.i} n1 = ({k.i})((({k.u})(ni + {k.half_offset})) >> 1) - {k.half_offset // 2};",
        f"    {k.v} s1 = {_pow2(k, 'n1')}, s2 = {_pow2(k, 'ni - n1')};",
        f"    {k.v} e = (s1 * p + s1) * s2;",
        f"    {k.u} nan = ({k.u})(a != a);",
        f"    return {_select(k, 'nan', 'a', 'e')};",
        "}"])


def _tanh(k: _Type) -> str:
    return "\n".join([
        f"static inline {k.v} ef_vtanh_{k.suffix}({k.v} a) {{",
        f"    const {k.u} sign = ({k.u}){{0}} + {k.sign};",
        f"    {k.v} x = ({k.v})(({k.u})a & ~sign);                   /* |a| */",
        f"    {k.u} one = ({k.u})(x > {k.tanh_one});",
        f"    {k.v} m = {_select(k, 'one', k.splat(k.tanh_one), 'x')} * -2{k.dot};",
        _reduction(k, "m"),
        f"    {k.v} s = {_pow2(k, 'ni')};",
        f"    {k.v} t = s * p + (s - 1{k.dot});                              /* expm1(-2|a|) */",
        f"    {k.v} y = -t / (2{k.dot} + t);",
        # |y| with a's sign: -0.0 stays -0.0, and y = -0.0 at a = 0 becomes +0.0
        f"    {k.u} bits = (({k.u})y & ~sign) | (({k.u})a & sign);",
        f"    {k.u} nan = ({k.u})(a != a);",
        f"    return {_select(k, 'nan', 'a', f'({k.v})bits')};",
        "}"])


def _logistic(k: _Type) -> str:
    return "\n".join([
        f"static inline {k.v} ef_vlogistic_{k.suffix}({k.v} a) {{",
        f"    const {k.u} sign = ({k.u}){{0}} + {k.sign};",
        # no clamp: where |a| > -logistic_low (and for NaN) e is garbage, and the result
        # is replaced at the end by 1 or 0 (or a)
        f"    {k.v} m = ({k.v})(({k.u})a | sign);                     /* -|a| */",
        _reduction(k, "m"),
        f"    {k.v} s = {_pow2(k, 'ni')};",
        f"    {k.v} e = s * p + s;                                   /* exp(-|a|) */",
        f"    {k.u} positive = ({k.u})(a >= 0{k.dot});",
        # 1 / (1 + e) for a >= 0, e / (1 + e) below: one division either way
        f"    {k.v} v = {_select(k, 'positive', k.splat('1' + k.dot), 'e')} / (1{k.dot} + e);",
        f"    {k.u} far = ({k.u})(m < {k.logistic_low}), nan = ({k.u})(a != a);",
        f"    {k.u} ends = far & positive & ({k.u}){k.splat('1' + k.dot)};",
        f"    return ({k.v})((({k.u})v & ~(far | nan)) | ends | (({k.u})a & nan));",
        "}"])


# -- the table form of the logistic, for 64-byte vectors ---------------------------------

# exp(r) - 1 - r ~= r^2 (c2 + c3 r + ... + c6 r^4) on |r| <= ln(2) / 32: a near-minimax
# fit (least squares at 300 Chebyshev nodes, 50 digits), relative error 2.8e-17
_POLY_D = ("0x1.0000000000001p-1", "0x1.55555554dd44cp-3", "0x1.55555554e9467p-5",
           "0x1.11120af70734dp-7", "0x1.6c17ed4cc8c81p-10")
# ln(2) / 16 split so that n * _LN2_16_HI is exact for |n| < 2^14 (float: 2^11)
_LN2_16_HI_D, _LN2_16_LO_D = "0x1.62e42fec00000p-5", "0x1.d1cf79abc9e3bp-36"
_LN2_16_HI_F, _LN2_16_LO_F = "0x1.62e000p-5f", "0x1.0bfbe8p-19f"
_INV_LN2_16_D, _INV_LN2_16_F = "0x1.71547652b82fep+4", "0x1.715476p+4f"


def _table(dtype: ScalarType) -> Tuple[str, ...]:
    """2^(j/16), j = 0..15, rounded to ``dtype``, as C literals."""
    values = [2.0 ** (j / 16) for j in range(16)]
    if dtype is ScalarType.FLOAT32:
        import numpy as np
        return tuple(float(np.float32(v)).hex() + "f" for v in values)
    return tuple(v.hex() for v in values)


def _table_logistic_double() -> str:
    table = _table(ScalarType.FLOAT64)
    c2, c3, c4, c5, c6 = _POLY_D
    return f"""\
static inline ef_vec_double ef_vlogistic_d(ef_vec_double a) {{
    const ef_vec_double t0 = {{{", ".join(table[:8])}}};
    const ef_vec_double t1 = {{{", ".join(table[8:])}}};
    const ef_vec_double shift = (ef_vec_double){{0}} + 0x1.8p52;
    const ef_vec_u64 sign = (ef_vec_u64){{0}} + 0x8000000000000000ULL;
    ef_vec_double m = (ef_vec_double)((ef_vec_u64)a | sign);          /* -|a| */
    ef_vec_u64 low = (ef_vec_u64)(m < -708.0);                       /* NaN: false */
    m = (ef_vec_double)((low & (ef_vec_u64)((ef_vec_double){{0}} - 708.0))
                        | (~low & (ef_vec_u64)m));
    ef_vec_double z = m * {_INV_LN2_16_D} + shift;                   /* 16 m / ln 2, rounded */
    ef_vec_double n = z - shift;
    ef_vec_double r = m - n * {_LN2_16_HI_D};
    r = r - n * {_LN2_16_LO_D};
    ef_vec_double p = r * {c6} + {c5};
    p = p * r + {c4};
    p = p * r + {c3};
    p = p * r + {c2};
    p = p * (r * r) + r;                                             /* exp(r) - 1 */
    ef_vec_u64 bits = (ef_vec_u64)z;                                  /* n in the low bits */
    ef_vec_double t = __builtin_shuffle(t0, t1, (ef_vec_i64)(bits & 15));
    ef_vec_double q = t * p + t;
    ef_vec_double e = (ef_vec_double)((ef_vec_u64)q + ((bits << 48) & 0xFFF0000000000000ULL));
    ef_vec_double y = 1.0 / (1.0 + e);
    ef_vec_u64 positive = (ef_vec_u64)(a >= 0.0);
    ef_vec_u64 s = (positive & (ef_vec_u64)y) | (~positive & (ef_vec_u64)(e * y));
    ef_vec_u64 keep = (ef_vec_u64)(a >= -708.0), nan = (ef_vec_u64)(a != a);
    return (ef_vec_double)((s & keep) | ((ef_vec_u64)a & nan));
}}"""


def _table_logistic_float() -> str:
    table = _table(ScalarType.FLOAT32)
    return f"""\
static inline ef_vec_float ef_vlogistic_f(ef_vec_float a) {{
    const ef_vec_float t = {{{", ".join(table)}}};
    const ef_vec_float shift = (ef_vec_float){{0}} + 0x1.8p23f;
    const ef_vec_u32 sign = (ef_vec_u32){{0}} + 0x80000000U;
    ef_vec_float m = (ef_vec_float)((ef_vec_u32)a | sign);           /* -|a| */
    ef_vec_u32 low = (ef_vec_u32)(m < -87.0f);                        /* NaN: false */
    m = (ef_vec_float)((low & (ef_vec_u32)((ef_vec_float){{0}} - 87.0f)) | (~low & (ef_vec_u32)m));
    ef_vec_float z = m * {_INV_LN2_16_F} + shift;
    ef_vec_float n = z - shift;
    ef_vec_float r = m - n * {_LN2_16_HI_F};
    r = r - n * {_LN2_16_LO_F};
    ef_vec_float p = r * {float(1 / 6).hex()}f + 0.5f;
    p = p * (r * r) + r;                                              /* exp(r) - 1 */
    ef_vec_u32 bits = (ef_vec_u32)z;
    ef_vec_float tj = __builtin_shuffle(t, (ef_vec_i32)(bits & 15));
    ef_vec_float q = tj * p + tj;
    ef_vec_float e = (ef_vec_float)((ef_vec_u32)q + ((bits << 19) & 0xFF800000U));
    ef_vec_float y = 1.0f / (1.0f + e);
    ef_vec_u32 positive = (ef_vec_u32)(a >= 0.0f);
    ef_vec_u32 s = (positive & (ef_vec_u32)y) | (~positive & (ef_vec_u32)(e * y));
    ef_vec_u32 keep = (ef_vec_u32)(a >= -87.0f), nan = (ef_vec_u32)(a != a);
    return (ef_vec_float)((s & keep) | ((ef_vec_u32)a & nan));
}}"""


def function(op: str, dtype: ScalarType, vector_bytes: int) -> Tuple[str, str]:
    """(name, C text) of the vector function ``op`` for ``dtype`` at ``vector_bytes``,
    its typedefs included."""
    k = _Type(dtype)
    if op == "logistic" and vector_bytes == 64:
        # one register holds half of the double table (all of the float one)
        body = _table_logistic_double() if k.suffix == "d" else _table_logistic_float()
    else:
        body = {"exp": _exp, "tanh": _tanh, "logistic": _logistic}[op](k)
    return f"ef_v{op}_{k.suffix}", typedefs(dtype, vector_bytes) + "\n" + body
