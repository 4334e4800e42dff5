/* The prepacked SGEMM's micro kernels and task driver (sgemm_task.inc), built per ISA: portable C,
 * AVX2+FMA (one 16-row panel x 6 columns, 12 ymm accumulators, or 6 rows x 16 columns) and AVX-512 (two panels, 32 rows x 12
 * columns, 24 zmm accumulators). Every level reads the same packed layout (sgemm.h). */
#include <stdlib.h>

#include "sgemm.h"

#define AI static inline __attribute__((always_inline))

/* ---- portable: one panel x 4 columns ---- */
#define SG_NR 4
#define SG_TWO 0
#define SG_ENTRY sg_task_portable
AI void sg_micro_p(const float *a0, const float *b, long ldb, long K, int nr, float *t)
{
    float c[SG_NR][16];
    for (int jj = 0; jj < SG_NR; jj++)
        for (int i = 0; i < 16; i++) c[jj][i] = 0.0f;
    for (long k = 0; k < K; k++) {
        const float *ak = a0 + k * 16, *bk = b + k * ldb;
        for (int jj = 0; jj < nr; jj++) {
            const float bv = bk[jj];
            for (int i = 0; i < 16; i++) c[jj][i] += ak[i] * bv;
        }
    }
    for (int jj = 0; jj < SG_NR; jj++)
        for (int i = 0; i < 16; i++) t[jj * 32 + i] = c[jj][i];
}
#define sg_micro sg_micro_portable
static void sg_micro(const float *a0, const float *a1, const float *b, long ldb, long K, int nr, float *t)
{
    (void)a1;
    sg_micro_p(a0, b, ldb, K, nr, t);
}
#include "sgemm_task.inc"
#undef sg_micro
#undef SG_NR
#undef SG_TWO
#undef SG_ENTRY

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

/* ---- AVX2 + FMA: one panel (2 ymm) x up to 6 columns ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SG_NR 6
#define SG_TWO 0
#define SG_ENTRY sg_task_avx2
AI void sg_micro2(const float *a0, const float *b, long ldb, long K, float *t, const int NRC)
{
    __m256 c0[SG_NR], c1[SG_NR];
    for (int jj = 0; jj < NRC; jj++) c0[jj] = c1[jj] = _mm256_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m256 x0 = _mm256_loadu_ps(a0 + k * 16), x1 = _mm256_loadu_ps(a0 + k * 16 + 8);
        const float *bk = b + k * ldb;
        for (int jj = 0; jj < NRC; jj++) {
            const __m256 bv = _mm256_broadcast_ss(bk + jj);
            c0[jj] = _mm256_fmadd_ps(x0, bv, c0[jj]);
            c1[jj] = _mm256_fmadd_ps(x1, bv, c1[jj]);
        }
    }
    for (int jj = 0; jj < NRC; jj++) {
        _mm256_storeu_ps(t + jj * 32, c0[jj]);
        _mm256_storeu_ps(t + jj * 32 + 8, c1[jj]);
    }
}
#define sg_micro sg_micro_avx2
static void sg_micro(const float *a0, const float *a1, const float *b, long ldb, long K, int nr, float *t)
{
    (void)a1;
    switch (nr) {
    case 1: sg_micro2(a0, b, ldb, K, t, 1); break;
    case 2: sg_micro2(a0, b, ldb, K, t, 2); break;
    case 3: sg_micro2(a0, b, ldb, K, t, 3); break;
    case 4: sg_micro2(a0, b, ldb, K, t, 4); break;
    case 5: sg_micro2(a0, b, ldb, K, t, 5); break;
    default: sg_micro2(a0, b, ldb, K, t, 6); break;
    }
}
#include "sgemm_task.inc"
#undef sg_micro
#undef SG_NR
#undef SG_TWO
#undef SG_ENTRY

/* ---- AVX2 along the columns: up to 6 panel rows x 16 columns (12 ymm accumulators) ----
 * For narrow weights (M % 16 <= 8: the row tile's second half is padding) or a short K
 * (sgemm.h: sg_ncols_avx2), as sg_ntask_avx512: each k broadcasts up to 6 weights of the panel and
 * multiplies two vectors of x's row k, so the tile's rows are stored as vectors with the epilogue
 * vectorised. Same k-order FMA chains from zero as sg_micro2: bit-identical results. */
AI __m256 sgn2_epilogue(__m256 v, __m256 lo, __m256 hi, int act, __m256 al)
{
    v = _mm256_min_ps(hi, _mm256_max_ps(lo, v)); /* max/min return their second operand on NaN: NaN stays */
    if (act == SG_ACT_LEAKY) /* v < 0 ? alpha * v : v (false on NaN: NaN stays) */
        return _mm256_blendv_ps(v, _mm256_mul_ps(v, al), _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    if (act) {
        const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
        __m256 h = _mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.0f / 6.0f)), _mm256_set1_ps(0.5f));
        h = _mm256_min_ps(one, _mm256_max_ps(zero, h));
        v = _mm256_mul_ps(v, h);
    }
    return v;
}

AI void sgn2_tile(const float *a, long K, const float *x, long N, long nr, float *y, const float *bias, __m256 lo,
                  __m256 hi, int act, __m256 al, const int R, const int FULL)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr), iota);
    const __m256i k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr - 8), iota);
    __m256 c0[6], c1[6];
    for (int i = 0; i < R; i++) c0[i] = c1[i] = _mm256_setzero_ps();
    for (long k = 0; k < K; k++) {
        const float *xk = x + k * N;
        const __m256 x0 = FULL ? _mm256_loadu_ps(xk) : _mm256_maskload_ps(xk, k0);
        const __m256 x1 = FULL ? _mm256_loadu_ps(xk + 8) : _mm256_maskload_ps(xk + 8, k1);
        const float *ak = a + k * SG_PANEL;
        for (int i = 0; i < R; i++) {
            const __m256 w = _mm256_broadcast_ss(ak + i);
            c0[i] = _mm256_fmadd_ps(w, x0, c0[i]);
            c1[i] = _mm256_fmadd_ps(w, x1, c1[i]);
        }
    }
    for (int i = 0; i < R; i++) {
        const __m256 b = _mm256_set1_ps(bias ? bias[i] : 0.0f);
        float *yr = y + (size_t)i * N;
        const __m256 v0 = sgn2_epilogue(_mm256_add_ps(c0[i], b), lo, hi, act, al);
        const __m256 v1 = sgn2_epilogue(_mm256_add_ps(c1[i], b), lo, hi, act, al);
        if (FULL) {
            _mm256_storeu_ps(yr, v0);
            _mm256_storeu_ps(yr + 8, v1);
        } else {
            _mm256_maskstore_ps(yr, k0, v0);
            _mm256_maskstore_ps(yr + 8, k1, v1);
        }
    }
}

#define SGN2_CASE(r) \
    case r: \
        if (nr == 16) \
            sgn2_tile(a, K, x, N, 16, y, bias, lo, hi, act, al, r, 1); \
        else \
            sgn2_tile(a, K, x, N, nr, y, bias, lo, hi, act, al, r, 0); \
        break;
static void sgn2_rows(const float *a, long K, const float *x, long N, long nr, long rows, float *y,
                      const float *bias, __m256 lo, __m256 hi, int act, __m256 al)
{
    switch (rows) {
        SGN2_CASE(1)
        SGN2_CASE(2)
        SGN2_CASE(3)
        SGN2_CASE(4)
        SGN2_CASE(5)
    default:
        SGN2_CASE(6)
    }
}

void sg_ntask_avx2(const sg_job *j, int t)
{
    const long nc = t % j->nnc, r = t / j->nnc, mc = r % j->nmc, bg = r / j->nmc, g = bg % j->G;
    const long K = j->K, N = j->N, M = j->M;
    const long n0 = nc * j->nchunk, n1 = n0 + j->nchunk < N ? n0 + j->nchunk : N;
    const long p0 = mc * j->mchunk, p1 = p0 + j->mchunk < j->P ? p0 + j->mchunk : j->P;
    if (n0 >= n1 || p0 >= p1) return;
    const float *x = j->x + (size_t)bg * K * N;
    float *y = j->y + (size_t)bg * M * N;
    const float *a = j->a + (size_t)g * j->P * K * SG_PANEL;
    const float *bias = j->bias ? j->bias + (size_t)g * M : NULL;
    const __m256 lo = _mm256_set1_ps(j->lo), hi = _mm256_set1_ps(j->hi), al = _mm256_set1_ps(j->alpha);
    for (long p = p0; p < p1; p++)
        for (long r0 = 0; r0 < SG_PANEL && p * SG_PANEL + r0 < M; r0 += 6) {
            const long m0 = p * SG_PANEL + r0, left = M - m0 < SG_PANEL - r0 ? M - m0 : SG_PANEL - r0;
            const long rows = left < 6 ? left : 6;
            const float *ap = a + (size_t)p * K * SG_PANEL + r0;
            for (long c0 = n0; c0 < n1; c0 += 16)
                sgn2_rows(ap, K, x + c0, N, n1 - c0 < 16 ? n1 - c0 : 16, rows, y + (size_t)m0 * N + c0,
                          bias ? bias + m0 : NULL, lo, hi, j->act, al);
        }
}
#pragma GCC pop_options

/* ---- AVX-512: two panels (2 zmm, 32 rows) x up to 12 columns, or one panel ----
 * The epilogue (bias, clip, HardSwish / LeakyRelu) runs on the accumulators, as the column task's
 * sgn_epilogue (below; the same operations as the scalar epilogue of sgemm_task.inc, so the same bits),
 * and the driver only transposes the tile into y: at 16 columns, K = 160 the scalar epilogue cost about a
 * fifth of the FMAs' time. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define SG_NR 12
#define SG_TWO 1
#define SG_ENTRY sg_task_avx512
#define SG_MICRO_EPI 1
AI __m512 sgn_epilogue(__m512 v, __m512 lo, __m512 hi, int act, __m512 al)
{
    v = _mm512_min_ps(hi, _mm512_max_ps(lo, v)); /* max/min return their second operand on NaN: NaN stays */
    if (act == SG_ACT_LEAKY) /* v < 0 ? alpha * v : v (false on NaN: NaN stays) */
        return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), v, al);
    if (act) {
        const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
        __m512 h = _mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.0f / 6.0f)), _mm512_set1_ps(0.5f));
        h = _mm512_min_ps(one, _mm512_max_ps(zero, h));
        v = _mm512_mul_ps(v, h);
    }
    return v;
}
/* the bias of up to 16 rows (zeros past `rows` and without a bias) */
AI __m512 sg_bias16(const float *bias, long rows)
{
    if (!bias || rows <= 0) return _mm512_setzero_ps();
    return _mm512_maskz_loadu_ps(rows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1), bias);
}
AI void sg_micro5(const float *a0, const float *a1, const float *b, long ldb, long K, float *t, const sg_job *j,
                  const float *bias, long rows, const int NRC)
{
    __m512 c0[SG_NR], c1[SG_NR];
    for (int jj = 0; jj < NRC; jj++) c0[jj] = c1[jj] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 x0 = _mm512_loadu_ps(a0 + k * 16), x1 = _mm512_loadu_ps(a1 + k * 16);
        const float *bk = b + k * ldb;
        for (int jj = 0; jj < NRC; jj++) {
            const __m512 bv = _mm512_set1_ps(bk[jj]);
            c0[jj] = _mm512_fmadd_ps(x0, bv, c0[jj]);
            c1[jj] = _mm512_fmadd_ps(x1, bv, c1[jj]);
        }
    }
    const __m512 b0 = sg_bias16(bias, rows), b1 = sg_bias16(bias ? bias + 16 : NULL, rows - 16);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi), al = _mm512_set1_ps(j->alpha);
    const int act = j->act;
    for (int jj = 0; jj < NRC; jj++) {
        _mm512_storeu_ps(t + jj * 32, sgn_epilogue(_mm512_add_ps(c0[jj], b0), lo, hi, act, al));
        _mm512_storeu_ps(t + jj * 32 + 16, sgn_epilogue(_mm512_add_ps(c1[jj], b1), lo, hi, act, al));
    }
}
AI void sg_micro5h(const float *a0, const float *b, long ldb, long K, float *t, const sg_job *j, const float *bias,
                   long rows, const int NRC)
{
    __m512 c0[SG_NR];
    for (int jj = 0; jj < NRC; jj++) c0[jj] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 x0 = _mm512_loadu_ps(a0 + k * 16);
        const float *bk = b + k * ldb;
        for (int jj = 0; jj < NRC; jj++) c0[jj] = _mm512_fmadd_ps(x0, _mm512_set1_ps(bk[jj]), c0[jj]);
    }
    const __m512 b0 = sg_bias16(bias, rows);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi), al = _mm512_set1_ps(j->alpha);
    for (int jj = 0; jj < NRC; jj++)
        _mm512_storeu_ps(t + jj * 32, sgn_epilogue(_mm512_add_ps(c0[jj], b0), lo, hi, j->act, al));
}
#define SG_CASE(n) \
    case n: \
        if (a1) \
            sg_micro5(a0, a1, b, ldb, K, t, j, bias, rows, n); \
        else \
            sg_micro5h(a0, b, ldb, K, t, j, bias, rows, n); \
        break;
#define sg_micro sg_micro_avx512
static void sg_micro(const float *a0, const float *a1, const float *b, long ldb, long K, int nr, float *t,
                     const sg_job *j, const float *bias, long rows)
{
    switch (nr) {
        SG_CASE(1)
        SG_CASE(2)
        SG_CASE(3)
        SG_CASE(4)
        SG_CASE(5)
        SG_CASE(6)
        SG_CASE(7)
        SG_CASE(8)
        SG_CASE(9)
        SG_CASE(10)
        SG_CASE(11)
    default:
        SG_CASE(12)
    }
}
#include "sgemm_task.inc"
#undef SG_MICRO_EPI

/* ---- AVX-512 along the columns: 8 panel rows x 32 columns (16 zmm accumulators) ----
 * For many output positions and a short K (sgemm.h: SG_NCOLS_MIN, SG_NCOLS_MAXK): each k broadcasts 8
 * weights of the panel and multiplies two vectors of x's row k, so the tile's rows are stored as vectors
 * with the epilogue vectorised (the row-vectorised tile above needs a scalar transposing epilogue,
 * which costs more than the FMAs at small K). Same k-order FMA chains from zero as sg_micro5: bit-identical results. */
AI void sgn_tile(const float *a, long K, const float *x, long N, long nr, long rows, float *y, const float *bias,
                 __m512 lo, __m512 hi, int act, __m512 al)
{
    const __mmask16 k0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    const __mmask16 k1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    __m512 c0[8], c1[8];
    for (int i = 0; i < 8; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 x0 = _mm512_maskz_loadu_ps(k0, x + k * N), x1 = _mm512_maskz_loadu_ps(k1, x + k * N + 16);
        const float *ak = a + k * SG_PANEL;
        for (int i = 0; i < 8; i++) {
            const __m512 w = _mm512_set1_ps(ak[i]);
            c0[i] = _mm512_fmadd_ps(w, x0, c0[i]);
            c1[i] = _mm512_fmadd_ps(w, x1, c1[i]);
        }
    }
    /* unrolled, each row's store guarded: indexing the accumulators by a variable row made GCC keep a copy
     * of all 16 in memory, stored on every k (16 stores per 16 FMAs: a third of the speed) */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        if (i >= rows) continue;
        const __m512 b = _mm512_set1_ps(bias ? bias[i] : 0.0f);
        float *yr = y + (size_t)i * N;
        _mm512_mask_storeu_ps(yr, k0, sgn_epilogue(_mm512_add_ps(c0[i], b), lo, hi, act, al));
        if (k1) _mm512_mask_storeu_ps(yr + 16, k1, sgn_epilogue(_mm512_add_ps(c1[i], b), lo, hi, act, al));
    }
}

void sg_ntask_avx512(const sg_job *j, int t)
{
    const long nc = t % j->nnc, r = t / j->nnc, mc = r % j->nmc, bg = r / j->nmc, g = bg % j->G;
    const long K = j->K, N = j->N, M = j->M;
    const long n0 = nc * j->nchunk, n1 = n0 + j->nchunk < N ? n0 + j->nchunk : N;
    const long p0 = mc * j->mchunk, p1 = p0 + j->mchunk < j->P ? p0 + j->mchunk : j->P;
    if (n0 >= n1 || p0 >= p1) return;
    const float *x = j->x + (size_t)bg * K * N;
    float *y = j->y + (size_t)bg * M * N;
    const float *a = j->a + (size_t)g * j->P * K * SG_PANEL;
    const float *bias = j->bias ? j->bias + (size_t)g * M : NULL;
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi), al = _mm512_set1_ps(j->alpha);
    for (long p = p0; p < p1; p++)
        for (long r0 = 0; r0 < SG_PANEL && p * SG_PANEL + r0 < M; r0 += 8) {
            const long m0 = p * SG_PANEL + r0, rows = M - m0 < 8 ? M - m0 : 8;
            const float *ap = a + (size_t)p * K * SG_PANEL + r0;
            for (long c0 = n0; c0 < n1; c0 += 32)
                sgn_tile(ap, K, x + c0, N, n1 - c0 < 32 ? n1 - c0 : 32, rows, y + (size_t)m0 * N + c0,
                         bias ? bias + m0 : NULL, lo, hi, j->act, al);
        }
}

/* ---- AVX-512 implicit-GEMM convolution (sgemm.h: sg_cjob) ----
 * sg_micro5 / sg_micro5h with column k of the tile read at xb + off[k] + jj * SW instead of b + k * ldb:
 * the same operands in the same order, the same epilogue; with a residual (rb: the tile's first output
 * in it) the epilogue adds it to acc + bias before the clip, as the unfused Conv, Add and Relu do. */
AI void sgc_micro(const float *a0, const float *a1, const float *xb, const long *off, long K, float *t,
                  const sg_cjob *j, const float *bias, long rows, const float *rb, const int NRC, const int TWO,
                  const int SW)
{
    __m512 c0[SG_NR], c1[SG_NR];
    for (int jj = 0; jj < NRC; jj++) c0[jj] = c1[jj] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 x0 = _mm512_loadu_ps(a0 + k * 16), x1 = TWO ? _mm512_loadu_ps(a1 + k * 16) : x0;
        const float *bk = xb + off[k];
        for (int jj = 0; jj < NRC; jj++) {
            const __m512 bv = _mm512_set1_ps(bk[jj * SW]);
            c0[jj] = _mm512_fmadd_ps(x0, bv, c0[jj]);
            if (TWO) c1[jj] = _mm512_fmadd_ps(x1, bv, c1[jj]);
        }
    }
    const __m512 b0 = sg_bias16(bias, rows), b1 = sg_bias16(bias ? bias + 16 : NULL, rows - 16);
    const __m512 lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi), al = _mm512_set1_ps(j->alpha);
    const int act = j->act;
    if (rb) { /* (acc + bias) + the residual of the tile's rows (gathered at the output plane's stride) */
        const long po = j->OH * j->OW;
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                                                 15), _mm512_set1_epi32((int)po));
        const __mmask16 m0 = rows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
        const __mmask16 m1 = rows >= 32 ? (__mmask16)0xFFFF : rows > 16 ? (__mmask16)((1u << (rows - 16)) - 1) : 0;
        for (int jj = 0; jj < NRC; jj++) {
            const __m512 r0 = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m0, idx, rb + jj, 4);
            _mm512_storeu_ps(t + jj * 32, sgn_epilogue(_mm512_add_ps(_mm512_add_ps(c0[jj], b0), r0), lo, hi, act, al));
            if (TWO) {
                const __m512 r1 = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m1, idx, rb + 16 * po + jj, 4);
                _mm512_storeu_ps(t + jj * 32 + 16,
                                 sgn_epilogue(_mm512_add_ps(_mm512_add_ps(c1[jj], b1), r1), lo, hi, act, al));
            }
        }
        return;
    }
    for (int jj = 0; jj < NRC; jj++) {
        _mm512_storeu_ps(t + jj * 32, sgn_epilogue(_mm512_add_ps(c0[jj], b0), lo, hi, act, al));
        if (TWO) _mm512_storeu_ps(t + jj * 32 + 16, sgn_epilogue(_mm512_add_ps(c1[jj], b1), lo, hi, act, al));
    }
}
#define SGC_CASE(n) \
    case n: \
        if (a1 && sw == 1) \
            sgc_micro(a0, a1, xb, j->off, K, t, j, bias, rows, rb, n, 1, 1); \
        else if (a1) \
            sgc_micro(a0, a1, xb, j->off, K, t, j, bias, rows, rb, n, 1, 2); \
        else if (sw == 1) \
            sgc_micro(a0, a1, xb, j->off, K, t, j, bias, rows, rb, n, 0, 1); \
        else \
            sgc_micro(a0, a1, xb, j->off, K, t, j, bias, rows, rb, n, 0, 2); \
        break;
static void sgc_micro_n(const float *a0, const float *a1, const float *xb, long sw, long K, int nr, float *t,
                        const sg_cjob *j, const float *bias, long rows, const float *rb)
{
    switch (nr) {
        SGC_CASE(1)
        SGC_CASE(2)
        SGC_CASE(3)
        SGC_CASE(4)
        SGC_CASE(5)
        SGC_CASE(6)
        SGC_CASE(7)
        SGC_CASE(8)
        SGC_CASE(9)
        SGC_CASE(10)
        SGC_CASE(11)
    default:
        SGC_CASE(12)
    }
}

/* conv_implicit's zero-padded copy: each of `planes` [H][W] planes of x into [HP][WP] of xp, row r of
 * the copy being row r - pt of the plane shifted right by pl (zeros outside the plane). Without `full`
 * only the plane's own positions are written: xp's zeros are those an earlier copy of the same geometry
 * wrote (sgemm.c keeps a buffer per geometry). In 16-float chunks of masked loads and stores. */
void sg_pad_avx512(const float *x, float *xp, long planes, long H, long W, long HP, long WP, long pt, long pl,
                   int full)
{
    const __m512 zero = _mm512_setzero_ps();
    const long r0 = pt < HP ? pt : HP, r1 = pt + H < HP ? pt + H : HP, c1 = pl + W < WP ? pl + W : WP;
    for (long q = 0; q < planes; q++) {
        const float *src = x + (size_t)q * H * W;
        float *dst = xp + (size_t)q * HP * WP;
        if (full)
            for (long r = 0; r < HP; r++)
                if (r < r0 || r >= r1)
                    for (long c0 = 0; c0 < WP; c0 += 16) {
                        const long n = WP - c0 < 16 ? WP - c0 : 16;
                        _mm512_mask_storeu_ps(dst + r * WP + c0, (__mmask16)((1u << n) - 1), zero);
                    }
        for (long r = r0; r < r1; r++) {
            float *row = dst + r * WP;
            const float *sr = src + (r - pt) * W - pl; /* padded column c reads sr[c], pl <= c < c1 */
            if (full) {
                for (long c0 = 0; c0 < pl; c0 += 16) {
                    const long n = pl - c0 < 16 ? pl - c0 : 16;
                    _mm512_mask_storeu_ps(row + c0, (__mmask16)((1u << n) - 1), zero);
                }
                for (long c0 = c1; c0 < WP; c0 += 16) {
                    const long n = WP - c0 < 16 ? WP - c0 : 16;
                    _mm512_mask_storeu_ps(row + c0, (__mmask16)((1u << n) - 1), zero);
                }
            }
            for (long c0 = pl; c0 < c1; c0 += 16) {
                const long n = c1 - c0 < 16 ? c1 - c0 : 16;
                const __mmask16 m = (__mmask16)((1u << n) - 1);
                _mm512_mask_storeu_ps(row + c0, m, _mm512_maskz_loadu_ps(m, sr + c0));
            }
        }
    }
}

/* task t: one image, a chunk of panels (pairs), a block of output rows; tiles of up to 12 outputs of a
 * row, the row split evenly (as sgemm_task.inc splits a column block) */
void sg_ctask_avx512(const sg_cjob *j, int t)
{
    const long rb = t % j->nrb, r = t / j->nrb, mc = r % j->nmc, img = r / j->nmc;
    const long p0 = mc * j->mchunk, p1 = p0 + j->mchunk < j->P ? p0 + j->mchunk : j->P;
    const long oy0 = rb * j->rows_per_task, oy1 = oy0 + j->rows_per_task < j->OH ? oy0 + j->rows_per_task : j->OH;
    if (p0 >= p1 || oy0 >= oy1) return;
    const long K = j->K, M = j->M, OW = j->OW, PO = j->OH * OW;
    const float *xi = j->xp + (size_t)img * j->img_stride;
    float *y = j->y + (size_t)img * M * PO;
    const long ntile = (OW + SG_NR - 1) / SG_NR, ncw = (OW + ntile - 1) / ntile;
    float tile[SG_NR * 32] __attribute__((aligned(64)));
    for (long p = p0; p < p1; p += 2) {
        const int two = p + 1 < p1;
        const long m0 = p * SG_PANEL, rows0 = M - m0 < (two ? 32 : 16) ? M - m0 : (two ? 32 : 16);
        const float *a0 = j->a + (size_t)p * K * SG_PANEL, *a1 = two ? a0 + (size_t)K * SG_PANEL : NULL;
        const float *bias = j->bias ? j->bias + m0 : NULL;
        for (long oy = oy0; oy < oy1; oy++)
            for (long c0 = 0; c0 < OW; c0 += ncw) {
                const long nr = OW - c0 < ncw ? OW - c0 : ncw;
                const float *xb = xi + oy * j->sh * j->WP + c0 * j->sw;
                /* the residual of this tile's first row and column (rows of the plane at stride PO) */
                const float *rb = j->res ? j->res + (size_t)img * M * PO + (size_t)m0 * PO + oy * OW + c0 : NULL;
                sgc_micro_n(a0, a1, xb, j->sw, K, (int)nr, tile, j, bias, rows0, rb);
                for (long i = 0; i < rows0; i++) {
                    float *yr = y + (size_t)(m0 + i) * PO + oy * OW + c0;
                    for (long jj = 0; jj < nr; jj++) yr[jj] = tile[jj * 32 + i];
                }
            }
    }
}
#pragma GCC pop_options
#else
void sg_task_avx2(const sg_job *j, int t) { sg_task_portable(j, t); }
void sg_task_avx512(const sg_job *j, int t) { sg_task_portable(j, t); }
void sg_ntask_avx512(const sg_job *j, int t) { sg_task_portable(j, t); }
void sg_ntask_avx2(const sg_job *j, int t) { sg_task_portable(j, t); }
void sg_ctask_avx512(const sg_cjob *j, int t)
{
    (void)j;
    (void)t;
}
void sg_pad_avx512(const float *x, float *xp, long planes, long H, long W, long HP, long WP, long pt, long pl,
                   int full)
{
    (void)x, (void)xp, (void)planes, (void)H, (void)W, (void)HP, (void)WP, (void)pt, (void)pl, (void)full;
}
#endif
