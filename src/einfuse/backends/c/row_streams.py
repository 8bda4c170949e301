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
"""
