/* Sigmoid over float32 (the SiLU of every Llama MLP): one pass, split over the pool for large inputs.
 *
 * The bits are onnxruntime's: its CPU Sigmoid is MLAS's logistic, a rational approximation (Eigen's
 * coefficients) on x clamped to [-18, 18]: p = x * P(x^2) (degree 4 in x^2), q = Q(x^2) (degree 5),
 * y = p / q + 0.5. What differs per ISA is the rounding of each step; every level here computes
 * MLAS's FMA3 kernel (also what it runs on AVX-512 machines, which have no logistic of their own): every
 * multiply-add fused, the result clamped below at 0 only; 8 or 16 lanes with a masked tail at avx2 and
 * above, one lane with fmaf at portable (logistic.h).
 * Each element is computed alone, so neither the tail nor the split over threads changes a bit.
 * NaN inputs come out NaN (max/min return their second operand when one is NaN, as in MLAS). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "act.h"
#include "logistic.h"
#include "pool.h"
#include "rnn_module.h" /* ext_isa_level */

typedef void sig_fn(const float *x, float *y, size_t n);

typedef struct {
    const float *x;
    float *y;
    size_t n, per;
    sig_fn *fn;
} sig_job;

static void sigmoid_portable(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = logistic1(x[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ACT_X86 1

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
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, logistic16(_mm512_maskz_loadu_ps(m, x + i)));
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
