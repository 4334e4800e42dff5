/* The dynamic INT8 ops of onnxruntime.quantization's models, exact by the ONNX spec.
 *
 * dql_u8: DynamicQuantizeLinear into uint8 in two passes (range, then quantize), with the float32
 * operations of kernels/quantize_dynamic.py's numpy code: scale = (max(hi, 0) - min(lo, 0)) / 255
 * (1 for an empty range), zp = rint(clamp(0 - lo / scale, 0, 255)), y = clamp(rint(x / scale) + zp, 0, 255)
 * with rint rounding half to even. Division, not a reciprocal multiply, so the bits are numpy's at every
 * level. A NaN or infinite input returns None: the caller takes its numpy path.
 *
 * qgemm_i16: MatMulInteger with a constant B, prepacked centered, int16 [ceil(K/2), N16, 2] (element
 * [p, n, j] = B[2p + j, n] - b_zp[n], zero past K and N; N16 = N rounded up to 16). A row is centered
 * into int16 (a - a_zp, in [-255, 255]) and every pair of k multiplies a pair of B in int32
 * (vpmaddwd: |product pair| <= 2 * 255 * 255, no saturation), summed in int32. The result is the exact
 * integer at every level, unlike a vpmaddubsw kernel (onnxruntime's U8S8 on AVX2), which saturates the
 * int16 sum of two u8*s8 products. Large products split over the pool in fixed blocks.
 *
 * dq_matmul_f32: the two above and the float rescale of quantize_dynamic's chain (resolve/fusions.py's
 * DynamicQuantizeMatMul) in one call, in the same operations: dql_u8's scale, zero point and quantized
 * x, qgemm_i16's exact int32 product, then (float)y32 * (a_scale * b_scale) (+ bias) in float32. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"
#include "qgemm.h"
#include "rnn_module.h" /* ext_isa_level */

#if defined(__x86_64__) || defined(_M_X64)
#define QG_X86 1
#include <immintrin.h>
#endif

/* ---- DynamicQuantizeLinear ---- */

static int range_portable(const float *x, long n, float *lo, float *hi)
{
    float a = 0.0f, b = 0.0f;
    for (long i = 0; i < n; i++) {
        const float v = x[i];
        if (!(v - v == 0.0f)) return 0; /* NaN or inf */
        a = v < a ? v : a;
        b = v > b ? v : b;
    }
    *lo = a;
    *hi = b;
    return 1;
}

static void quantize_portable(const float *x, uint8_t *y, long n, float scale, float zp)
{
    for (long i = 0; i < n; i++) {
        float q = rintf(x[i] / scale) + zp;
        q = q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
        y[i] = (uint8_t)q;
    }
}

#ifdef QG_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static int range_avx2(const float *x, long n, float *lo, float *hi)
{
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        a = _mm256_min_ps(a, v);
        b = _mm256_max_ps(b, v);
    }
    if (_mm256_movemask_ps(bad)) return 0;
    float la[8], ha[8];
    _mm256_storeu_ps(la, a);
    _mm256_storeu_ps(ha, b);
    float l = 0.0f, h = 0.0f;
    if (!range_portable(x + i, n - i, &l, &h)) return 0;
    for (int j = 0; j < 8; j++) {
        l = la[j] < l ? la[j] : l;
        h = ha[j] > h ? ha[j] : h;
    }
    *lo = l;
    *hi = h;
    return 1;
}

static void quantize_avx2(const float *x, uint8_t *y, long n, float scale, float zp)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zp), top = _mm256_set1_ps(255.0f);
    const __m256 zero = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, z), zero), top);
        const __m256i w = _mm256_cvtps_epi32(q);
        const __m128i p16 = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        const __m128i p8 = _mm_packus_epi16(p16, p16);
        _mm_storel_epi64((__m128i *)(y + i), p8);
    }
    quantize_portable(x + i, y + i, n - i, scale, zp);
}
#pragma GCC pop_options
#endif

/* dql_u8(x float32, y uint8, n) -> (scale, zero point) or None */
PyObject *py_dql_u8(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "dql_u8 takes 3 positional arguments");
        return NULL;
    }
    const long n = PyLong_AsLong(args[2]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_buffer bx, by;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&bx);
        return NULL;
    }
    if (n < 0 || bx.len != 4 * (Py_ssize_t)n || by.len != (Py_ssize_t)n) {
        PyBuffer_Release(&bx);
        PyBuffer_Release(&by);
        PyErr_SetString(PyExc_ValueError, "dql_u8: x must hold n float32 and y n bytes");
        return NULL;
    }
    const float *x = (const float *)bx.buf;
    uint8_t *y = (uint8_t *)by.buf;
    float lo = 0.0f, hi = 0.0f, scale = 1.0f, zp = 0.0f;
    int ok;
    Py_BEGIN_ALLOW_THREADS
#ifdef QG_X86
    const int simd = ext_isa_level() >= 1;
    ok = simd ? range_avx2(x, n, &lo, &hi) : range_portable(x, n, &lo, &hi);
#else
    ok = range_portable(x, n, &lo, &hi);
#endif
    if (ok) {
        if (hi != lo) {
            volatile float d = hi - lo; /* the float32 difference, as numpy rounds it */
            scale = d / 255.0f;
        }
        float t = 0.0f - lo / scale;
        t = t < 0.0f ? 0.0f : t > 255.0f ? 255.0f : t;
        zp = rintf(t);
#ifdef QG_X86
        if (simd)
            quantize_avx2(x, y, n, scale, zp);
        else
            quantize_portable(x, y, n, scale, zp);
#else
        quantize_portable(x, y, n, scale, zp);
#endif
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    if (!ok) Py_RETURN_NONE;
    return Py_BuildValue("(di)", (double)scale, (int)zp);
}

/* ---- MatMulInteger on centered int16 pairs ---- */

typedef struct {
    const uint8_t *a; /* [M, K], uint8 or int8 (signed_a) */
    int16_t *ac;      /* [M, 2 Kp]: A centered (the caller's scratch) */
    const int16_t *b; /* [Kp, N16, 2] */
    int32_t *y;       /* [M, N] */
    long M, K, N, Kp, N16;
    int signed_a, a_zp;
    long rows_per_task, cols_per_task, col_tasks; /* cols_per_task: a multiple of 16 */
    int simd;
} qg_job;

/* every row of A, centered, into int16 rows of 2 Kp (zero past K) */
static void center_rows(const qg_job *j)
{
    const long w = 2 * j->Kp;
    for (long r = 0; r < j->M; r++) {
        const uint8_t *src = j->a + r * j->K;
        int16_t *dst = j->ac + r * w;
        if (j->signed_a)
            for (long k = 0; k < j->K; k++) dst[k] = (int16_t)((int)(int8_t)src[k] - j->a_zp);
        else
            for (long k = 0; k < j->K; k++) dst[k] = (int16_t)((int)src[k] - j->a_zp);
        for (long k = j->K; k < w; k++) dst[k] = 0;
    }
}

static void block_portable(const qg_job *j, const int16_t *ac, long m0, int nr, long n0, long n1)
{
    const long w = 2 * j->Kp;
    for (int r = 0; r < nr; r++) {
        const int16_t *ar = ac + r * w;
        int32_t *yr = j->y + (m0 + r) * j->N;
        for (long n = n0; n < n1; n++) {
            int32_t s = 0;
            for (long p = 0; p < j->Kp; p++) {
                const int16_t *bp = j->b + (p * j->N16 + n) * 2;
                s += (int32_t)ar[2 * p] * bp[0] + (int32_t)ar[2 * p + 1] * bp[1];
            }
            yr[n] = s;
        }
    }
}

#ifdef QG_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline void store16(int32_t *yr, long left, __m256i lo, __m256i hi)
{
    if (left >= 16) {
        _mm256_storeu_si256((__m256i *)yr, lo);
        _mm256_storeu_si256((__m256i *)(yr + 8), hi);
    } else {
        int32_t tmp[16];
        _mm256_storeu_si256((__m256i *)tmp, lo);
        _mm256_storeu_si256((__m256i *)(tmp + 8), hi);
        memcpy(yr, tmp, (size_t)left * 4);
    }
}

static inline __m256i pair_at(const int16_t *a)
{
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

/* 4 rows x 16 columns per step: 8 int32 accumulators in registers; rows past the fourth use the
 * one-row kernel below */
static void block_avx2(const qg_job *j, const int16_t *ac, long m0, int nr, long n0, long n1)
{
    const long w = 2 * j->Kp, ld = 2 * j->N16, Kp = j->Kp;
    if (nr == 4) {
        const int16_t *a0 = ac, *a1 = ac + w, *a2 = ac + 2 * w, *a3 = ac + 3 * w;
        for (long n = n0; n < n1; n += 16) {
            __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
            __m256i c30 = c00, c31 = c00;
            const int16_t *bp = j->b + 2 * n;
            for (long p = 0; p < Kp; p++, bp += ld) {
                const __m256i b0 = _mm256_loadu_si256((const __m256i *)bp);
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + 16));
                __m256i av = pair_at(a0 + 2 * p);
                c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(av, b0));
                c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(av, b1));
                av = pair_at(a1 + 2 * p);
                c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(av, b0));
                c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(av, b1));
                av = pair_at(a2 + 2 * p);
                c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(av, b0));
                c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(av, b1));
                av = pair_at(a3 + 2 * p);
                c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(av, b0));
                c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(av, b1));
            }
            int32_t *yr = j->y + m0 * j->N + n;
            const long left = j->N - n;
            store16(yr, left, c00, c01);
            store16(yr + j->N, left, c10, c11);
            store16(yr + 2 * j->N, left, c20, c21);
            store16(yr + 3 * j->N, left, c30, c31);
        }
        return;
    }
    for (int r = 0; r < nr; r++) {
        const int16_t *a0 = ac + r * w;
        for (long n = n0; n < n1; n += 16) {
            __m256i c0 = _mm256_setzero_si256(), c1 = c0;
            const int16_t *bp = j->b + 2 * n;
            for (long p = 0; p < Kp; p++, bp += ld) {
                const __m256i av = pair_at(a0 + 2 * p);
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(av, _mm256_loadu_si256((const __m256i *)bp)));
                c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(av, _mm256_loadu_si256((const __m256i *)(bp + 16))));
            }
            store16(j->y + (m0 + r) * j->N + n, j->N - n, c0, c1);
        }
    }
}
#pragma GCC pop_options
#endif

static void qg_task(void *ctx, int t)
{
    const qg_job *j = (const qg_job *)ctx;
    const long ri = t / j->col_tasks, ci = t % j->col_tasks;
    const long m0 = ri * j->rows_per_task, m1 = m0 + j->rows_per_task < j->M ? m0 + j->rows_per_task : j->M;
    const long n0 = ci * j->cols_per_task, n1 = n0 + j->cols_per_task < j->N ? n0 + j->cols_per_task : j->N;
    for (long m = m0; m < m1; m += 4) {
        const int nr = m1 - m < 4 ? (int)(m1 - m) : 4;
        const int16_t *ac = j->ac + m * 2 * j->Kp;
#ifdef QG_X86
        if (j->simd) {
            block_avx2(j, ac, m, nr, n0, n1);
            continue;
        }
#endif
        block_portable(j, ac, m, nr, n0, n1);
    }
}

/* qgemm_i16(a, signed_a, a_zp, b_packed, y, scratch, M, K, N) -> None; scratch: 4 M Kp bytes */
PyObject *py_qgemm_i16(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "qgemm_i16 takes 9 positional arguments");
        return NULL;
    }
    const long signed_a = PyLong_AsLong(args[1]), a_zp = PyLong_AsLong(args[2]);
    const long M = PyLong_AsLong(args[6]), K = PyLong_AsLong(args[7]), N = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (M < 0 || K < 1 || N < 1 || M > (1L << 30) || K > (1L << 24) || N > (1L << 24) ||
        a_zp < (signed_a ? -128 : 0) || a_zp > (signed_a ? 127 : 255)) {
        PyErr_SetString(PyExc_ValueError, "qgemm_i16: bad shape or zero point");
        return NULL;
    }
    const long Kp = (K + 1) / 2, N16 = (N + 15) / 16 * 16;
    Py_buffer ba, bb, by, bs;
    if (PyObject_GetBuffer(args[0], &ba, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &bb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&ba);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ba);
        PyBuffer_Release(&bb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[5], &bs, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ba);
        PyBuffer_Release(&bb);
        PyBuffer_Release(&by);
        return NULL;
    }
    PyObject *ret = NULL;
    if (ba.len != (Py_ssize_t)M * K || bb.len != (Py_ssize_t)Kp * N16 * 4 || by.len != (Py_ssize_t)M * N * 4 ||
        bs.len < (Py_ssize_t)M * Kp * 4) {
        PyErr_SetString(PyExc_ValueError, "qgemm_i16: a, b, y or scratch does not match M, K, N");
        goto done;
    }
    qg_job j = {(const uint8_t *)ba.buf, (int16_t *)bs.buf, (const int16_t *)bb.buf, (int32_t *)by.buf, M, K, N,
                Kp, N16, (int)signed_a, (int)a_zp, M, N16, 1, 0};
#ifdef QG_X86
    j.simd = ext_isa_level() >= 1;
#endif
    if (M == 0) {
        ret = Py_None;
        Py_INCREF(ret);
        goto done;
    }
    /* ~256 Ki multiply-adds per task: a pool hand-off costs about what a few of those blocks do; the
     * blocks depend on the shape only, and every block's integers are exact anyway */
    const double work = (double)M * K * N;
    int tasks = 1;
    if (work > (double)(1 << 19)) {
        j.rows_per_task = 32;
        j.cols_per_task = 128;
        j.col_tasks = (N16 + 127) / 128;
        tasks = (int)(((M + 31) / 32) * j.col_tasks);
    }
    Py_BEGIN_ALLOW_THREADS
    center_rows(&j);
    if (tasks == 1)
        qg_task(&j, 0);
    else
        nb_pool_run(qg_task, &j, tasks);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&ba);
    PyBuffer_Release(&bb);
    PyBuffer_Release(&by);
    PyBuffer_Release(&bs);
    return ret;
}

/* ---- DynamicQuantizeLinear + MatMulInteger + the float rescale, one call ---- */

typedef struct {
    qg_job g;
    const float *b_scale; /* [1] or [N] */
    const float *bias;    /* [N] or NULL */
    long n_scale;
    float a_scale;
} dqm_job;

/* the rescale of rows [m0, m1), columns [n0, n1) in place: y = (float)y32 * (a_scale * b_scale) (+ bias), the
 * unfused graph's Cast, Mul of the two scales (float32) and Mul (and Add) */
static void dqm_epilogue(const dqm_job *d, long m0, long m1, long n0, long n1)
{
    const long N = d->g.N;
    for (long m = m0; m < m1; m++) {
        int32_t *yi = d->g.y + m * N;
        float *yf = (float *)(void *)yi;
        for (long n = n0; n < n1; n++) {
            const float sm = d->a_scale * d->b_scale[d->n_scale == 1 ? 0 : n];
            float v = (float)yi[n] * sm;
            if (d->bias) v = v + d->bias[n];
            yf[n] = v;
        }
    }
}

static void dqm_task(void *ctx, int t)
{
    const dqm_job *d = (const dqm_job *)ctx;
    qg_task((void *)&d->g, t);
    const qg_job *j = &d->g;
    const long ri = t / j->col_tasks, ci = t % j->col_tasks;
    const long m0 = ri * j->rows_per_task, m1 = m0 + j->rows_per_task < j->M ? m0 + j->rows_per_task : j->M;
    const long n0 = ci * j->cols_per_task, n1 = n0 + j->cols_per_task < j->N ? n0 + j->cols_per_task : j->N;
    dqm_epilogue(d, m0, m1, n0, n1);
}

/* dq_matmul_f32(x f32 [M, K], b_packed, b_scale f32 [1|N], bias f32 [N]|None, y f32 [M, N], scratch, M, K, N)
 * -> True, or None when x holds NaN or inf (the caller runs the unfused numpy chain). scratch: M K bytes
 * (the quantized x) then 4 M Kp bytes (it centered), as qgemm_i16 takes them. */
PyObject *py_dq_matmul_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "dq_matmul_f32 takes 9 positional arguments");
        return NULL;
    }
    const long M = PyLong_AsLong(args[6]), K = PyLong_AsLong(args[7]), N = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (M < 0 || K < 1 || N < 1 || M > (1L << 30) || K > (1L << 24) || N > (1L << 24)) {
        PyErr_SetString(PyExc_ValueError, "dq_matmul_f32: bad shape");
        return NULL;
    }
    const long Kp = (K + 1) / 2, N16 = (N + 15) / 16 * 16;
    Py_buffer b[6];
    const int writable[6] = {0, 0, 0, 0, 1, 1};
    int got = 0;
    PyObject *ret = NULL;
    for (; got < 6; got++) {
        memset(&b[got], 0, sizeof b[got]);
        if (args[got] == Py_None) continue;
        if (PyObject_GetBuffer(args[got], &b[got], PyBUF_C_CONTIGUOUS | (writable[got] ? PyBUF_WRITABLE : 0)) < 0) {
            b[got].obj = NULL;
            goto done;
        }
    }
    if (!b[0].obj || !b[1].obj || !b[2].obj || !b[4].obj || !b[5].obj || b[0].len != (Py_ssize_t)M * K * 4 ||
        b[1].len != (Py_ssize_t)Kp * N16 * 4 || (b[2].len != 4 && b[2].len != (Py_ssize_t)N * 4) ||
        (b[3].obj && b[3].len != (Py_ssize_t)N * 4) || b[4].len != (Py_ssize_t)M * N * 4 ||
        b[5].len < (Py_ssize_t)M * K + (Py_ssize_t)M * Kp * 4 + 64) {
        PyErr_SetString(PyExc_ValueError, "dq_matmul_f32: x, b, b_scale, bias, y or scratch does not match M, K, N");
        goto done;
    }
    const float *x = (const float *)b[0].buf;
    uint8_t *q = (uint8_t *)b[5].buf;
    int16_t *ac = (int16_t *)(void *)(q + ((M * K + 63) / 64) * 64);
    dqm_job d = {{q, ac, (const int16_t *)b[1].buf, (int32_t *)b[4].buf, M, K, N, Kp, N16, 0, 0, M, N16, 1, 0},
                 (const float *)b[2].buf, b[3].obj ? (const float *)b[3].buf : NULL, b[2].len / 4, 1.0f};
    const long n = M * K;
    float lo = 0.0f, hi = 0.0f, scale = 1.0f, zp = 0.0f;
    int ok;
#ifdef QG_X86
    d.g.simd = ext_isa_level() >= 1;
#endif
    const double work = (double)M * K * N;
    int tasks = 1;
    if (work > (double)(1 << 19)) { /* qgemm_i16's blocks */
        d.g.rows_per_task = 32;
        d.g.cols_per_task = 128;
        d.g.col_tasks = (N16 + 127) / 128;
        tasks = (int)(((M + 31) / 32) * d.g.col_tasks);
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef QG_X86
    ok = d.g.simd ? range_avx2(x, n, &lo, &hi) : range_portable(x, n, &lo, &hi);
#else
    ok = range_portable(x, n, &lo, &hi);
#endif
    if (ok) { /* dql_u8's scale and zero point, in its float32 operations */
        if (hi != lo) {
            volatile float dd = hi - lo;
            scale = dd / 255.0f;
        }
        float t = 0.0f - lo / scale;
        t = t < 0.0f ? 0.0f : t > 255.0f ? 255.0f : t;
        zp = rintf(t);
#ifdef QG_X86
        if (d.g.simd)
            quantize_avx2(x, q, n, scale, zp);
        else
            quantize_portable(x, q, n, scale, zp);
#else
        quantize_portable(x, q, n, scale, zp);
#endif
        d.g.a_zp = (int)zp;
        d.a_scale = scale;
        if (M) {
            center_rows(&d.g);
            if (tasks == 1)
                dqm_task(&d, 0);
            else
                nb_pool_run(dqm_task, &d, tasks);
        }
    }
    Py_END_ALLOW_THREADS
    ret = ok ? Py_True : Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
