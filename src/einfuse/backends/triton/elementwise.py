"""Triton functions for ``sign``, ``tan``, ``atan2`` and Python's ``//`` and ``%``, for
backends/triton/render.py (appended to triton_helpers.HELPERS in every kernel).

Triton kernels compute in float32/float64 only (integer statements run on the NumPy
reference, see triton_backend.py), so these are the float forms:

* ``//`` and ``%`` follow NumPy's ``npy_divmod`` step by step, as the C helpers do
  (c_elementwise.py): ``ef_fmod`` is C's exact ``fmod`` (libdevice's on a GPU, where
  Triton's float ``%`` is ``a - trunc(a / b) * b``, off for quotients beyond 2**53;
  ``%`` under the interpreter, which is NumPy's ``fmod`` and has no libdevice); the
  quotient ``(a - mod) / b`` is snapped to an integer; zero results take the sign of
  ``a / b`` (``//``) or of ``b`` (``%``); a zero divisor gives ``a / b`` and NaN.
* ``tan`` and ``atan2`` are computed in float64 and rounded to the working dtype: libdevice
  (which has them) is not interpreted, so ``tan`` is ``sin / cos`` and ``atan2`` reduces
  its argument to ``|v| <= tan(pi/16)`` and sums atan's series to ``v**27``, then applies
  C99's quadrants, signed zeros and infinities, as NumPy's ``arctan2`` has them.
"""

from ...ir import BinaryOp, Function

ELEMENTWISE_HELPERS = '''
@triton.jit
def ef_negative(x):
    # the sign bit: x < 0, or x = -0
    return (x < 0.0) | ((x == 0.0) & (1.0 / x < 0.0))


@triton.jit
def ef_floordiv(a, b):
    mod = ef_fmod(a, b)
    div = ef_div(a - mod, b)
    div = tl.where((mod != 0.0) & ((b < 0.0) != (mod < 0.0)), div - 1.0, div)
    low = tl.floor(div)
    snapped = tl.where(div - low > 0.5, low + 1.0, low)
    q = ef_div(a, b)
    # div = 0: a zero with the sign of a / b, which is finite there
    return tl.where(b == 0.0, q, tl.where(div == 0.0, q * 0.0, snapped))


@triton.jit
def ef_pymod(a, b):
    mod = ef_fmod(a, b)
    mod = tl.where((mod != 0.0) & ((b < 0.0) != (mod < 0.0)), mod + b, mod)
    # a zero result takes the sign of b: -(m * m) is -0 for m = +-0
    zero = tl.where(b < 0.0, ef_neg(mod * mod), mod * mod)
    return tl.where((mod == 0.0) & (b != 0.0), zero, mod)


@triton.jit
def ef_sign(x):
    return tl.where(x > 0.0, 1.0, tl.where(x < 0.0, -1.0, tl.where(x == x, 0.0, x)))


@triton.jit
def ef_tan(x):
    w = x.to(tl.float64)
    return (tl.sin(w) / tl.cos(w)).to(x.dtype)


@triton.jit
def ef_atan2(a, b):
    y = a.to(tl.float64)
    x = b.to(tl.float64)
    ay = tl.abs(y)
    ax = tl.abs(x)
    small = ay <= ax
    t = tl.where(small, ay / ax, ax / ay)     # in [0, 1]; NaN for 0/0 and inf/inf
    # atan(t) = pi/4 + atan(u), u = (t - 1) / (t + 1), above tan(pi/8); then
    # atan(u) = 2 atan(v), v = u / (1 + sqrt(1 + u*u)), above tan(pi/16)
    high = t > 0.41421356237309503
    u = tl.where(high, (t - 1.0) / (t + 1.0), t)
    halve = tl.abs(u) > 0.19891236737965800
    v = tl.where(halve, u / (1.0 + tl.sqrt(1.0 + u * u)), u)
    v2 = v * v
    p = 1.0 / 27.0
    for k in tl.static_range(25, 0, -2):
        p = 1.0 / k - v2 * p
    r = v * p
    r = tl.where(halve, 2.0 * r, r)
    r = tl.where(high, 0.7853981633974483 + r, r)
    r = tl.where(small, r, 1.5707963267948966 - r)
    r = tl.where((ay == float("inf")) & (ax == float("inf")), 0.7853981633974483, r)
    r = tl.where((ay == 0.0) & (ax == 0.0), 0.0, r)
    r = tl.where(ef_negative(x), 3.141592653589793 - r, r)
    r = tl.where(ef_negative(y), ef_neg(r), r)
    return r.to(a.dtype)
'''

# C's fmod and a correctly rounded division, by where the kernel runs (True: compiled
# for a GPU, where Triton's float32 '/' is div.full.f32, within 2 ulp: floor division's
# quotient (a - mod) / b came out one ulp off for huge values on an H100)
TARGET_HELPERS = {True: '''
from triton.language.extra import libdevice


@triton.jit
def ef_fmod(a, b):
    return libdevice.fmod(a, b)


@triton.jit
def ef_div(a, b):
    # (float64 '/' is correctly rounded already; div_rn takes float32 only)
    if a.dtype == tl.float32:
        q = tl.math.div_rn(a, b)
    else:
        q = a / b
    return q
''', False: '''
@triton.jit
def ef_fmod(a, b):
    return a % b


@triton.jit
def ef_div(a, b):
    return a / b
'''}

# the ast operator / function -> the Triton function that computes it
OPERATORS = {BinaryOp.FLOOR_DIV: "ef_floordiv", BinaryOp.MOD: "ef_pymod"}
FUNCTIONS = {Function.SIGN: "ef_sign", Function.TAN: "ef_tan", Function.ATAN2: "ef_atan2"}
