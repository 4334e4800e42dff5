/* Sigmoid over float32 (the SiLU of every Llama MLP): one pass, split over the pool for large inputs.
 *
 * The bits are onnxruntime's: its CPU Sigmoid is MLAS's logistic, a rational approximation (Eigen's
 * coefficients) on x clamped to [-18, 18]: p = x * P(x^2) (degree 4 in x^2), q = Q(x^2) (degree 5),
 * y = p / q + 0.5. What differs per ISA is the rounding of each step, so every level here repeats the
 * kernel MLAS dispatches on such a CPU:
 * - avx2 and above: MLAS's FMA3 kernel (also what it runs on AVX-512 machines, which have no logistic of
 *   their own): every multiply-add fused, the result clamped below at 0 only, the tail a masked vector;
 * - portable: MLAS's SSE2 kernel: separate multiplies and adds, the result clamped to [0, 1].
 * Each element is computed alone, so neither the tail nor the split over threads changes a bit.
 * NaN inputs come out NaN (max/min return their second operand when one is NaN, as in MLAS). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "act.h"
#include "pool.h"
#include "rnn_module.h" /* ext_isa_level */

#define LG_LO (-18.0f)
#define LG_HI 18.0f
#define LG_A9 4.37031012579801e-11f
#define LG_A7 1.15627324459942e-07f
#define LG_A5 6.08574864600143e-05f
#define LG_A3 8.51377133304701e-03f
#define LG_A1 2.48287947061529e-01f
#define LG_B10 6.10247389755681e-13f
#define LG_B8 5.76102136993427e-09f
#define LG_B6 6.29106785017040e-06f
#define LG_B4 1.70198817374094e-03f
#define LG_B2 1.16817656904453e-01f
#define LG_B0 9.93151921023180e-01f

typedef void sig_fn(const float *x, float *y, size_t n);

typedef struct {
    const float *x;
    float *y;
    size_t n, per;
    sig_fn *fn;
} sig_job;

/* SSE2 semantics: every product and sum rounded on its own (no FMA target here, so GCC cannot contract
 * them on x86-64) */
static void sigmoid_portable(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        v = v < LG_LO ? LG_LO : v;
        v = v > LG_HI ? LG_HI : v;
        const float v2 = v * v;
        float p = v2 * LG_A9 + LG_A7;
        p = p * v2 + LG_A5;
        p = p * v2 + LG_A3;
        p = p * v2 + LG_A1;
        p = p * v;
        float q = v2 * LG_B10 + LG_B8;
        q = q * v2 + LG_B6;
        q = q * v2 + LG_B4;
        q = q * v2 + LG_B2;
        q = q * v2 + LG_B0;
        float r = p / q + 0.5f;
        r = r < 0.0f ? 0.0f : r;
        y[i] = r > 1.0f ? 1.0f : r;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ACT_X86 1

/* one vector of MLAS's FMA3 logistic */
__attribute__((target("avx2,fma"))) static inline __m256 logistic8(__m256 v)
{
    v = _mm256_max_ps(_mm256_set1_ps(LG_LO), v);
    v = _mm256_min_ps(_mm256_set1_ps(LG_HI), v);
    const __m256 v2 = _mm256_mul_ps(v, v);
    __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(LG_A9), _mm256_set1_ps(LG_A7));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A5));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A3));
    p = _mm256_fmadd_ps(v2, p, _mm256_set1_ps(LG_A1));
    __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(LG_B10), _mm256_set1_ps(LG_B8));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B6));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B4));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B2));
    q = _mm256_fmadd_ps(v2, q, _mm256_set1_ps(LG_B0));
    p = _mm256_mul_ps(v, p);
    const __m256 r = _mm256_add_ps(_mm256_div_ps(p, q), _mm256_set1_ps(0.5f));
    return _mm256_max_ps(_mm256_setzero_ps(), r);
}

__attribute__((target("avx2,fma"))) static void sigmoid_avx2(const float *x, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, logistic8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(y + i, m, logistic8(_mm256_maskload_ps(x + i, m)));
    }
}

__attribute__((target("avx512f"))) static void sigmoid_avx512(const float *x, float *y, size_t n)
{
    const __m512 lo = _mm512_set1_ps(LG_LO), hi = _mm512_set1_ps(LG_HI);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
        const __m512 v2 = _mm512_mul_ps(v, v);
        __m512 p = _mm512_fmadd_ps(v2, _mm512_set1_ps(LG_A9), _mm512_set1_ps(LG_A7));
        p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A5));
        p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A3));
        p = _mm512_fmadd_ps(v2, p, _mm512_set1_ps(LG_A1));
        __m512 q = _mm512_fmadd_ps(v2, _mm512_set1_ps(LG_B10), _mm512_set1_ps(LG_B8));
        q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B6));
        q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B4));
        q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B2));
        q = _mm512_fmadd_ps(v2, q, _mm512_set1_ps(LG_B0));
        p = _mm512_mul_ps(v, p);
        const __m512 r = _mm512_add_ps(_mm512_div_ps(p, q), _mm512_set1_ps(0.5f));
        _mm512_mask_storeu_ps(y + i, m, _mm512_max_ps(_mm512_setzero_ps(), r));
    }
}
#endif

static void sig_task(void *ctx, int t)
{
    sig_job *j = (sig_job *)ctx;
    const size_t i0 = (size_t)t * j->per, i1 = i0 + j->per < j->n ? i0 + j->per : j->n;
    if (i0 < i1) j->fn(j->x + i0, j->y + i0, i1 - i0);
}

/* The (x, y) arguments of an elementwise float32 op: x readable, y writable, the same length in whole
 * floats. 0 with both buffers held (the caller releases them), -1 with an exception set and none held. */
static int float_pair(PyObject *const *args, Py_ssize_t nargs, const char *name, Py_buffer *bx, Py_buffer *by)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(x, y)", name);
        return -1;
    }
    if (PyObject_GetBuffer(args[0], bx, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(args[1], by, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(bx);
        return -1;
    }
    if (bx->len != by->len || bx->len % 4) {
        PyErr_Format(PyExc_ValueError, "%s: x and y must be float32 buffers of the same length", name);
        PyBuffer_Release(by);
        PyBuffer_Release(bx);
        return -1;
    }
    return 0;
}

/* sigmoid(x, y) -> True: x, y float32 buffers of the same length (C-contiguous; y may be x) */
PyObject *py_sigmoid(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_buffer bx, by;
    if (float_pair(args, nargs, "sigmoid", &bx, &by) < 0) return NULL;
    sig_job j = {(const float *)bx.buf, (float *)by.buf, (size_t)bx.len / 4, 0, sigmoid_portable};
#ifdef ACT_X86
    const int level = ext_isa_level();
    j.fn = level >= 3 ? sigmoid_avx512 : level >= 1 ? sigmoid_avx2 : sigmoid_portable;
#endif
    Py_BEGIN_ALLOW_THREADS
    /* 16 Ki floats per task: large enough to amortize a pool hand-off, small enough to balance */
    const size_t chunk = (size_t)1 << 14;
    int nt = (int)((j.n + chunk - 1) / chunk);
    if (nt < 1) nt = 1;
    j.per = ((j.n + (size_t)nt - 1) / (size_t)nt + 15) & ~(size_t)15;
    if (nt == 1)
        j.fn(j.x, j.y, j.n);
    else
        nb_pool_run(sig_task, &j, nt);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&by);
    PyBuffer_Release(&bx);
    Py_RETURN_TRUE;
}

/* hardswish(x, y) -> True: y = x * clip(x * (1/6) + 1/2, 0, 1) over float32 buffers of the same length
 * (y may be x), in numpy's order of roundings (a multiply, an add, the clip, a multiply: no contraction in
 * ISO C), so the same bits as the numpy kernel; one pass instead of numpy's four ufunc calls (MobileNetV3's
 * 1024-wide head: 6.6 -> ~0.6 us). A NaN stays NaN (both comparisons false). */
PyObject *py_hardswish(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_buffer bx, by;
    if (float_pair(args, nargs, "hardswish", &bx, &by) < 0) return NULL;
    const float *x = (const float *)bx.buf;
    float *y = (float *)by.buf;
    const size_t n = (size_t)bx.len / 4;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < n; i++) {
        const float v = x[i];
        float h = v * (1.0f / 6.0f) + 0.5f;
        h = h < 0.0f ? 0.0f : h;
        h = h > 1.0f ? 1.0f : h;
        y[i] = h * v;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&by);
    PyBuffer_Release(&bx);
    Py_RETURN_TRUE;
}

/* relu(x, y) -> True: y = x > 0 || x is NaN ? x : +0 over float32 buffers of the same length (y may be x):
 * numpy's maximum(x, 0) bit for bit (NaN kept with its payload, -0.0 to +0.0), one pass that GCC
 * vectorizes (ResNet-18's [2, 64, 16, 16]: ~12 us in np.maximum) */
PyObject *py_relu(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_buffer bx, by;
    if (float_pair(args, nargs, "relu", &bx, &by) < 0) return NULL;
    const float *x = (const float *)bx.buf;
    float *y = (float *)by.buf;
    const size_t n = (size_t)bx.len / 4;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = (v > 0.0f || v != v) ? v : 0.0f;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&by);
    PyBuffer_Release(&bx);
    Py_RETURN_TRUE;
}
