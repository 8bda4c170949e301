"""The C helpers every kernel carries for gathered subscripts (plan/gathers.py decides
which one a subscript uses; c_render.py prints the call)."""

# Gathered positions on their exact value (plan/gathers.py): the "one" form (one gather,
# coefficient +-1: g + a, or a - g) compares the index value g with the range before
# adding the affine part a, in arithmetic that cannot overflow (|a| < 2**63 is checked
# per call), and gives the position saturated to -1 or n; the "wide" form has the
# wrapped int64 sum and a double estimate of the true value (their difference counts
# the multiples of 2**64 lost).  bounds= then applies to the saturated position as
# usual; wrap= takes residues instead.
GATHER_HELPERS = """\
static inline int64_t ef_sat_sp(int64_t g, int64_t a, int64_t n) {
  uint64_t d = (uint64_t)g + (uint64_t)a;
  return g < -a ? -1 : (d >= (uint64_t)n ? n : (int64_t)d);
}
static inline int64_t ef_sat_sm(int64_t g, int64_t a, int64_t n) {
  uint64_t d = (uint64_t)a - (uint64_t)g;
  return g > a ? -1 : (d >= (uint64_t)n ? n : (int64_t)d);
}
static inline int64_t ef_sat_up(uint64_t g, int64_t a, int64_t n) {
  if (a >= 0) return (a >= n || g >= (uint64_t)(n - a)) ? n : (int64_t)g + a;
  uint64_t d = g - (uint64_t)(-a);
  return g < (uint64_t)(-a) ? -1 : (d >= (uint64_t)n ? n : (int64_t)d);
}
static inline int64_t ef_sat_um(uint64_t g, int64_t a, int64_t n) {
  uint64_t d = (uint64_t)a - g;
  return (a < 0 || g > (uint64_t)a) ? -1 : (d >= (uint64_t)n ? n : (int64_t)d);
}
/* x + y mod n for residues x, y in [0, n), without overflow */
static inline int64_t ef_addmod(int64_t x, int64_t y, int64_t n) { return x >= n - y ? x - (n - y) : x + y; }
static inline int64_t ef_wrapu(uint64_t g, int64_t n) { return (int64_t)(g % (uint64_t)n); }
static inline int64_t ef_wrap_sp(int64_t g, int64_t a, int64_t n) {
  int64_t d;
  if (!__builtin_add_overflow(g, a, &d)) return ef_wrap(d, n);
  return ef_addmod(ef_wrap(g, n), ef_wrap(a, n), n);
}
static inline int64_t ef_wrap_sm(int64_t g, int64_t a, int64_t n) {
  int64_t d;
  if (!__builtin_sub_overflow(a, g, &d)) return ef_wrap(d, n);
  return ef_addmod(ef_wrap(a, n), (n - ef_wrap(g, n)) % n, n);
}
static inline int64_t ef_wrap_up(uint64_t g, int64_t a, int64_t n) { return ef_addmod(ef_wrapu(g, n), ef_wrap(a, n), n); }
static inline int64_t ef_wrap_um(uint64_t g, int64_t a, int64_t n) { return ef_addmod(ef_wrap(a, n), (n - ef_wrapu(g, n)) % n, n); }
/* wide form: the true value is lo + k * 2**64 */
static inline int64_t ef_wide_k(int64_t lo, double f) { return (int64_t)rint((f - (double)lo) * 0x1p-64); }
static inline int64_t ef_sat_w(int64_t lo, double f, int64_t n) {
  int64_t k = ef_wide_k(lo, f);
  return (k < 0 || (k == 0 && lo < 0)) ? -1 : ((k > 0 || lo >= n) ? n : lo);
}
static inline int64_t ef_wrap_w(int64_t lo, double f, int64_t n) {
  int64_t k = ef_wide_k(lo, f), m = ef_wrap(k, n);
  if (k == 0) return ef_wrap(lo, n);
  for (int s = 0; s < 4; ++s) m = (m << 16) % n;   /* k * 2**64 mod n, as n < 2**47 */
  return ef_addmod(ef_wrap(lo, n), m, n);
}
"""
