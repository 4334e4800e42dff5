/* depthwise.inc built three times: portable, AVX2+FMA and AVX-512 (x86-64; elsewhere all portable). */
#include "depthwise.h"

#define DW_ENTRY dw_planes_portable
#define DW_CL_ENTRY dw_cl_portable
#define DW_BLK_ENTRY dw_blk_portable
#define DW_VEC 4
#define plane plane_portable
#define dw_vec dw_vec_portable
#define dw_ivec dw_ivec_portable
#define dw_select dw_select_portable
#include "depthwise.inc"
#undef DW_ENTRY
#undef DW_CL_ENTRY
#undef DW_BLK_ENTRY
#undef DW_VEC
#undef plane
#undef dw_vec
#undef dw_ivec
#undef dw_select

#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
/* 8 rows of 8 floats (row i at src + i * ss) transposed: row i of the result to dst[i] (dw_t8p) or to
 * dst + i * ds (dw_t8); the channel block's copies in and out of its channels-innermost scratch
 * (depthwise.inc), data movement only */
static inline void dw_t8p(const float *src, long ss, float *const dst[8])
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ss), r2 = _mm256_loadu_ps(src + 2 * ss);
    __m256 r3 = _mm256_loadu_ps(src + 3 * ss), r4 = _mm256_loadu_ps(src + 4 * ss), r5 = _mm256_loadu_ps(src + 5 * ss);
    __m256 r6 = _mm256_loadu_ps(src + 6 * ss), r7 = _mm256_loadu_ps(src + 7 * ss);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3);
    const __m256 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst[0], _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst[1], _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst[2], _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst[3], _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst[4], _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst[5], _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst[6], _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst[7], _mm256_permute2f128_ps(u3, u7, 0x31));
}
static inline void dw_t8(const float *src, long ss, float *dst, long ds)
{
    float *const d[8] = {dst, dst + ds, dst + 2 * ds, dst + 3 * ds, dst + 4 * ds, dst + 5 * ds, dst + 6 * ds,
                         dst + 7 * ds};
    dw_t8p(src, ss, d);
}
#define DW_T8P dw_t8p
#define DW_T8 dw_t8
#define DW_ENTRY dw_planes_avx2
#define DW_CL_ENTRY dw_cl_avx2
#define DW_BLK_ENTRY dw_blk_avx2
#define DW_VEC 8
#define plane plane_avx2
#define dw_vec dw_vec_avx2
#define dw_ivec dw_ivec_avx2
#define dw_select dw_select_avx2
#include "depthwise.inc"
#undef DW_ENTRY
#undef DW_CL_ENTRY
#undef DW_BLK_ENTRY
#undef DW_VEC
#undef plane
#undef dw_vec
#undef dw_ivec
#undef dw_select
#undef DW_T8
#undef DW_T8P
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
/* the AVX2 8x8 transposes, 8 of a block's 16 channels at a time (without them the channel-blocked and
 * channels-last copies are scalar: 16 channels at 32x32, 3x3 on Zen 5: 22 us against 11 at AVX2) */
#define DW_T8P dw_t8p
#define DW_T8 dw_t8
#define DW_ENTRY dw_planes_avx512
#define DW_CL_ENTRY dw_cl_avx512
#define DW_BLK_ENTRY dw_blk_avx512
#define DW_VEC 16
#define plane plane_avx512
#define dw_vec dw_vec_avx512
#define dw_ivec dw_ivec_avx512
#define dw_select dw_select_avx512
#include "depthwise.inc"
#pragma GCC pop_options
#else
void dw_planes_avx2(const dw_job *j, int t) { dw_planes_portable(j, t); }
void dw_planes_avx512(const dw_job *j, int t) { dw_planes_portable(j, t); }
void dw_cl_avx2(const dw_job *j, int t) { dw_cl_portable(j, t); }
void dw_cl_avx512(const dw_job *j, int t) { dw_cl_portable(j, t); }
void dw_blk_avx2(const dw_job *j, int t) { dw_blk_portable(j, t); }
void dw_blk_avx512(const dw_job *j, int t) { dw_blk_portable(j, t); }
#endif
