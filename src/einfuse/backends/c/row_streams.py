"""C source of the row kernels' streaming stores (spliced into rows_source.TEMPLATE):
a row kernel whose output is larger than the caches writes it with stores that bypass
them, so that a line written is not first read from memory.

Zen 4, one thread, a 16 MiB float32 copy: 1.13 ms with ordinary stores (glibc's memcpy
too), 0.79 ms streamed.  A softmax or layernorm row of 1024 float32 read from memory and
written back: the written line's read was a third of the traffic."""

SOURCE = r"""/* Rows written to memory past the caches are stored around them: a store that misses
   the cache first reads the line it writes (a third of a softmax's traffic, the matrix
   read, the line read, the line written back), where a streaming store writes the line
   alone.  Taken where a call's output is EF_STREAM bytes or more: larger, it would not
   stay in the caches for its reader anyway (the L3 is 32 MiB here, shared with the
   input and other cores); smaller, it may, and a streamed row would be read back from
   memory by the next kernel (Zen 4, one thread, rows of 1024 float32, a layernorm and
   a softmax called in turn: 8 MiB out, 487 -> 224 and 418 -> 357 ns a row streamed;
   16 MiB, 611 -> 436 and 470 -> 438; 2 MiB, the same either way).  The stores are
   made visible (sfence) before the kernel returns. */
#define EF_STREAM ((int64_t)8 << 20)
#define EF_VECTOR_BYTES (VW * (EF_SINGLE ? 4 : 8))
#if defined(__AVX512F__)
#define EF_STREAM_WIDTH 64
#elif defined(__AVX__)
#define EF_STREAM_WIDTH 32
#elif defined(__SSE2__)
#define EF_STREAM_WIDTH 16
#else
#define EF_STREAM_WIDTH 0
#endif
#if EF_STREAM_WIDTH
#include <immintrin.h>
#endif
static inline int ef_streams(int64_t rows, int64_t n) {
  return EF_STREAM_WIDTH >= EF_VECTOR_BYTES && rows * n * (int64_t)sizeof(T) >= EF_STREAM;
}
/* *p = v, p aligned to the vector's size, around the caches */
static inline void ef_stream_store(T *p, vT v) {
#if EF_STREAM_WIDTH >= 64 && EF_VECTOR_BYTES == 64
  _mm512_stream_si512((void *)p, (__m512i)v);
#elif EF_STREAM_WIDTH >= 32 && EF_VECTOR_BYTES == 32
  _mm256_stream_si256((__m256i *)p, (__m256i)v);
#elif EF_STREAM_WIDTH >= 16 && EF_VECTOR_BYTES == 16
  _mm_stream_si128((__m128i *)p, (__m128i)v);
#else
  ef_store(p, v);
#endif
}
static inline void ef_stream_fence(void) {
#if EF_STREAM_WIDTH
  _mm_sfence();
#endif
}
/* the lanes before p's first vector-aligned address (all of n where it has none) */
static inline int64_t ef_unaligned(const T *p, int64_t n) {
  const uintptr_t size = VW * sizeof(T), at = (uintptr_t)p;
  if (at % sizeof(T)) return n;
  return ef_min(n, (int64_t)(((size - at % size) % size) / sizeof(T)));
}

/* dst[0, n) = src[0, n), streamed where dst's vectors are aligned */
static inline void ef_stream_copy(T *dst, const T *src, int64_t n) {
  int64_t j = 0;
  for (const int64_t head = ef_unaligned(dst, n); j < head; ++j) dst[j] = src[j];
  for (; j + VW <= n; j += VW) ef_stream_store(dst + j, ef_load(src + j));
  for (; j < n; ++j) dst[j] = src[j];
}

/* A scaled row still to be written, dst[k, n) = src[k, n) * scale, its head before k
   written already: a softmax's previous row, streamed out 4 VW values at a time by the
   next row's exponentials (ef_exp_block) so that its stores overlap their arithmetic;
   written out as one burst after its own row, the stores stalled it (a 4 kB row's
   lines go out at the memory's pace). */
typedef struct { const T *src; T *dst; vT scale; int64_t k, n; } ef_out;
/* the job for dst[0, n) = src[0, n) * scale, its head (the lanes before dst's first
   aligned vector) written now */
static inline ef_out ef_out_start(const T *src, T *dst, T scale, int64_t n) {
  const ef_out o = {src, dst, ef_splat(scale), ef_unaligned(dst, n), n};
  for (int64_t j = 0; j < o.k; ++j) dst[j] = src[j] * scale;
  return o;
}
/* the next 4 VW values (the caller checks that they are there) */
static inline void ef_out_step(ef_out *o) {
  const T *src = o->src + o->k;
  T *dst = o->dst + o->k;
  ef_stream_store(dst, ef_load(src) * o->scale);
  ef_stream_store(dst + VW, ef_load(src + VW) * o->scale);
  ef_stream_store(dst + 2 * VW, ef_load(src + 2 * VW) * o->scale);
  ef_stream_store(dst + 3 * VW, ef_load(src + 3 * VW) * o->scale);
  o->k += 4 * VW;
}
/* what is left */
static inline void ef_out_finish(ef_out *o) {
  for (; o->k + VW <= o->n; o->k += VW)
    ef_stream_store(o->dst + o->k, ef_load(o->src + o->k) * o->scale);
  for (; o->k < o->n; ++o->k) o->dst[o->k] = o->src[o->k] * o->scale[0];
}
"""
