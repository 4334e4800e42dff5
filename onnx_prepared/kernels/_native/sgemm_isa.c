/* The prepacked SGEMM's micro kernels and task driver (sgemm_task.inc), built per ISA: portable C,
 * AVX2+FMA (one 16-row panel x 6 columns, 12 ymm accumulators) and AVX-512 (two panels, 32 rows x 12
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
#pragma GCC pop_options

/* ---- AVX-512: two panels (2 zmm, 32 rows) x up to 12 columns, or one panel ---- */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,prefer-vector-width=512")
#define SG_NR 12
#define SG_TWO 1
#define SG_ENTRY sg_task_avx512
AI void sg_micro5(const float *a0, const float *a1, const float *b, long ldb, long K, float *t, const int NRC)
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
    for (int jj = 0; jj < NRC; jj++) {
        _mm512_storeu_ps(t + jj * 32, c0[jj]);
        _mm512_storeu_ps(t + jj * 32 + 16, c1[jj]);
    }
}
AI void sg_micro5h(const float *a0, const float *b, long ldb, long K, float *t, const int NRC)
{
    __m512 c0[SG_NR];
    for (int jj = 0; jj < NRC; jj++) c0[jj] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m512 x0 = _mm512_loadu_ps(a0 + k * 16);
        const float *bk = b + k * ldb;
        for (int jj = 0; jj < NRC; jj++) c0[jj] = _mm512_fmadd_ps(x0, _mm512_set1_ps(bk[jj]), c0[jj]);
    }
    for (int jj = 0; jj < NRC; jj++) _mm512_storeu_ps(t + jj * 32, c0[jj]);
}
#define SG_CASE(n) \
    case n: \
        if (a1) \
            sg_micro5(a0, a1, b, ldb, K, t, n); \
        else \
            sg_micro5h(a0, b, ldb, K, t, n); \
        break;
#define sg_micro sg_micro_avx512
static void sg_micro(const float *a0, const float *a1, const float *b, long ldb, long K, int nr, float *t)
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
#pragma GCC pop_options
#else
void sg_task_avx2(const sg_job *j, int t) { sg_task_portable(j, t); }
void sg_task_avx512(const sg_job *j, int t) { sg_task_portable(j, t); }
#endif
