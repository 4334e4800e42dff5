/* winpool.inc built three times: portable, AVX2 and AVX-512 (x86-64; elsewhere all portable). */
#include "winpool.h"

#define WP_ENTRY wp_planes_portable
#define plane plane_portable
#define reduce reduce_portable
#define horizontal horizontal_portable
#define is_2x2 is_2x2_portable
#define plane_2x2 plane_2x2_portable
#include "winpool.inc"
#undef WP_ENTRY
#undef plane
#undef reduce
#undef horizontal
#undef is_2x2
#undef plane_2x2

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define WP_ENTRY wp_planes_avx2
#define plane plane_avx2
#define reduce reduce_avx2
#define horizontal horizontal_avx2
#define is_2x2 is_2x2_avx2
#define plane_2x2 plane_2x2_avx2
#include "winpool.inc"
#undef WP_ENTRY
#undef plane
#undef reduce
#undef horizontal
#undef is_2x2
#undef plane_2x2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define WP_ENTRY wp_planes_avx512
#define plane plane_avx512
#define reduce reduce_avx512
#define horizontal horizontal_avx512
#define is_2x2 is_2x2_avx512
#define plane_2x2 plane_2x2_avx512
#include "winpool.inc"

int wp_max_direct_ok(const wp_job *j)
{
    return !j->avg && j->dh == 1 && j->dw == 1 && (j->sw == 1 || j->sw == 2) && j->KW <= 16 && j->KH <= 64;
}

/* plane()'s reduce on 16 lanes: v where v > acc or v is NaN, else acc */
static inline __m512 wp_rd(__m512 acc, __m512 v)
{
    const __mmask16 m = _mm512_cmp_ps_mask(v, acc, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(acc, m, v);
}

/* the bits [lo, hi) of a 32-bit lane mask, clamped to [0, 32] */
static inline unsigned wp_span(long lo, long hi)
{
    lo = lo < 0 ? 0 : lo > 32 ? 32 : lo;
    hi = hi < lo ? lo : hi > 32 ? 32 : hi;
    const unsigned long long m = ((1ULL << hi) - 1ULL) & ~((1ULL << lo) - 1ULL);
    return (unsigned)m;
}

/* 16 outputs from ow0 of one input row: tap kj of lane i reads column (ow0 + i) * sw - pl + kj, -inf
 * outside the row (masked loads with the block's masks m[kj]: nothing read outside it) */
static inline __m512 wp_hrow(const wp_job *j, const float *row, long ow0, const unsigned *m, __m512i even)
{
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    const float *src = row + ow0 * j->sw - j->pl;
    __m512 acc = ninf;
    if (j->sw == 1) {
        acc = _mm512_mask_loadu_ps(ninf, (__mmask16)m[0], src);
        for (long kj = 1; kj < j->KW; kj++) acc = wp_rd(acc, _mm512_mask_loadu_ps(ninf, (__mmask16)m[kj], src + kj));
        return acc;
    }
    for (long kj = 0; kj < j->KW; kj++) {
        const __m512 a = _mm512_mask_loadu_ps(ninf, (__mmask16)(m[kj] & 0xFFFF), src + kj);
        const __m512 b = _mm512_mask_loadu_ps(ninf, (__mmask16)(m[kj] >> 16), src + kj + 16);
        const __m512 v = _mm512_permutex2var_ps(a, even, b);
        acc = kj ? wp_rd(acc, v) : v;
    }
    return acc;
}

enum { WP_HZ_ROWS = 128 };

void wp_planes_max_avx512(const wp_job *j, int t)
{
    const long total = j->N * j->C;
    const long p0 = (long)t * j->planes_per_task;
    const long p1 = p0 + j->planes_per_task < total ? p0 + j->planes_per_task : total;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    __m512 hz[WP_HZ_ROWS]; /* the horizontal pass of the block's input rows (H <= WP_HZ_ROWS) */
    unsigned m[16];
    for (long ow0 = 0; ow0 < j->OW; ow0 += 16) {
        const long n = j->OW - ow0 < 16 ? j->OW - ow0 : 16;
        for (long kj = 0; kj < j->KW; kj++) { /* lanes whose tap kj is inside the row, per load */
            const long s = ow0 * j->sw - j->pl + kj;
            m[kj] = wp_span(-s, j->W - s);
        }
        for (long p = p0; p < p1; p++) {
            const float *x = j->x + (size_t)p * j->H * j->W;
            float *y = j->y + (size_t)p * j->OH * j->OW;
            const int cached = j->H <= WP_HZ_ROWS;
            if (cached)
                for (long ih = 0; ih < j->H; ih++) hz[ih] = wp_hrow(j, x + ih * j->W, ow0, m, even);
            for (long oh = 0; oh < j->OH; oh++) {
                __m512 acc = ninf;
                int first = 1;
                for (long ki = 0; ki < j->KH; ki++) {
                    const long ih = oh * j->sh - j->pt + ki;
                    if (ih < 0 || ih >= j->H) continue; /* a padded row: every tap -inf */
                    const __m512 h = cached ? hz[ih] : wp_hrow(j, x + ih * j->W, ow0, m, even);
                    acc = first ? h : wp_rd(acc, h);
                    first = 0;
                }
                _mm512_mask_storeu_ps(y + oh * j->OW + ow0, (__mmask16)((1u << n) - 1u), acc);
            }
        }
    }
}
#pragma GCC pop_options
#else
void wp_planes_avx2(const wp_job *j, int t) { wp_planes_portable(j, t); }
void wp_planes_avx512(const wp_job *j, int t) { wp_planes_portable(j, t); }
int wp_max_direct_ok(const wp_job *j)
{
    (void)j;
    return 0;
}
void wp_planes_max_avx512(const wp_job *j, int t) { wp_planes_portable(j, t); }
#endif
