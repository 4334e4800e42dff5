/* y = a @ w (+ bias) for the small float32 products of a transformer encoder's linear layers (MatMulBias:
 * rows = batch x sequence, a few dozen to a few hundred; K and N the hidden sizes), where a BLAS call's
 * fixed cost (~8-10 us through numpy) is most of the time. w is the plain row-major [K, N] (MatMul's
 * prepared panel), read 16 columns at a time; every output is one sum over k in order, 0 to K - 1,
 * then the bias added. AVX2 (dispatch level avx2 and above): 4 rows x 16 columns of fused multiply-adds
 * in registers; portable: the same order with a product rounded, then added (ISO C, no contraction), so
 * the two differ by rounding only. Large products are left to BLAS by the caller. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "encoder_gemm.h"
#include "rnn_module.h" /* ext_isa_level */

#if defined(__x86_64__) || defined(_M_X64)
#define EG_X86 1
#include <immintrin.h>
#endif

static void gemm_portable(const float *a, const float *w, const float *bias, float *y, long M, long K, long N)
{
    for (long m = 0; m < M; m++)
        for (long n = 0; n < N; n++) {
            float s = 0.0f;
            for (long k = 0; k < K; k++) s += a[m * K + k] * w[k * N + n];
            y[m * N + n] = bias ? s + bias[n] : s;
        }
}

#ifdef EG_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
/* columns [n0, n0 + 16) of rows [m0, m0 + nr), nr <= 4, from a panel p (row k at p + k * ld) */
static inline void tile_avx2(const float *a, const float *p, long ld, const float *bias16, float *out, long ldo,
                             long m0, int nr, long K, int cols)
{
    __m256 c[4][2];
    for (int r = 0; r < 4; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (long k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(p + k * ld), b1 = _mm256_loadu_ps(p + k * ld + 8);
        for (int r = 0; r < nr; r++) { /* nr is 4 in the steady loop: unrolled */
            const __m256 av = _mm256_broadcast_ss(a + (m0 + r) * K + k);
            c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        __m256 v0 = c[r][0], v1 = c[r][1];
        if (bias16) {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias16));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias16 + 8));
        }
        float *o = out + (m0 + r) * ldo;
        if (cols == 16) {
            _mm256_storeu_ps(o, v0);
            _mm256_storeu_ps(o + 8, v1);
        } else {
            float t[16];
            _mm256_storeu_ps(t, v0);
            _mm256_storeu_ps(t + 8, v1);
            memcpy(o, t, (size_t)cols * 4);
        }
    }
}

static void gemm_avx2(const float *a, const float *w, const float *bias, float *y, long M, long K, long N,
                      float *tail)
{
    for (long n0 = 0; n0 < N; n0 += 16) {
        const int cols = N - n0 >= 16 ? 16 : (int)(N - n0);
        const float *p = w + n0;
        long ld = N;
        float b16[16];
        const float *bp = NULL;
        if (cols < 16) { /* the last panel, zero-padded to 16 columns in the caller's scratch */
            for (long k = 0; k < K; k++) {
                memcpy(tail + k * 16, w + k * N + n0, (size_t)cols * 4);
                memset(tail + k * 16 + cols, 0, (size_t)(16 - cols) * 4);
            }
            p = tail;
            ld = 16;
        }
        if (bias) {
            memset(b16, 0, sizeof b16);
            memcpy(b16, bias + n0, (size_t)cols * 4);
            bp = b16;
        }
        long m = 0;
        for (; m + 4 <= M; m += 4) tile_avx2(a, p, ld, bp, y + n0, N, m, 4, K, cols);
        if (m < M) tile_avx2(a, p, ld, bp, y + n0, N, m, (int)(M - m), K, cols);
    }
}
#pragma GCC pop_options
#endif

/* gemm_bias_f32(a [M, K], w [K, N], bias [N]|None, y [M, N], scratch (>= 64 K bytes), M, K, N) -> None */
PyObject *py_gemm_bias_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "gemm_bias_f32 takes 8 positional arguments");
        return NULL;
    }
    const long M = PyLong_AsLong(args[5]), K = PyLong_AsLong(args[6]), N = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    if (M < 0 || K < 1 || N < 1 || M > (1L << 24) || K > (1L << 20) || N > (1L << 20)) {
        PyErr_SetString(PyExc_ValueError, "gemm_bias_f32: bad shape");
        return NULL;
    }
    Py_buffer b[5];
    const int writable[5] = {0, 0, 0, 1, 1};
    int got = 0;
    PyObject *ret = NULL;
    for (; got < 5; got++) {
        memset(&b[got], 0, sizeof b[got]);
        if (args[got] == Py_None) continue;
        if (PyObject_GetBuffer(args[got], &b[got], PyBUF_C_CONTIGUOUS | (writable[got] ? PyBUF_WRITABLE : 0)) < 0) {
            b[got].obj = NULL;
            goto done;
        }
    }
    if (!b[0].obj || !b[1].obj || !b[3].obj || !b[4].obj || b[0].len != (Py_ssize_t)M * K * 4 ||
        b[1].len != (Py_ssize_t)K * N * 4 || (b[2].obj && b[2].len != (Py_ssize_t)N * 4) ||
        b[3].len != (Py_ssize_t)M * N * 4 || b[4].len < (Py_ssize_t)K * 64) {
        PyErr_SetString(PyExc_ValueError, "gemm_bias_f32: a, w, bias, y or scratch does not match M, K, N");
        goto done;
    }
    const float *a = (const float *)b[0].buf, *w = (const float *)b[1].buf;
    const float *bias = b[2].obj ? (const float *)b[2].buf : NULL;
    float *y = (float *)b[3].buf, *tail = (float *)b[4].buf;
#ifdef EG_X86
    const int simd = ext_isa_level() >= 1;
#else
    const int simd = 0;
#endif
    Py_BEGIN_ALLOW_THREADS
#ifdef EG_X86
    if (simd)
        gemm_avx2(a, w, bias, y, M, K, N, tail);
    else
#endif
        gemm_portable(a, w, bias, y, M, K, N);
    Py_END_ALLOW_THREADS
    (void)simd;
    (void)tail;
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
