/* Erf, the exact GELU and Softmax of transformer encoders (a BERT layer's GELU and attention), one call each
 * instead of the dozen numpy passes that dominate small tensors.
 *
 * erf_f32 is kernels/activation.py's rational approximation (Eigen's generic_fast_erf_float: clamp to
 * [-4, 4], x * P(x^2) / Q(x^2)) in the same float32 operations and order (a multiply, then an add, never
 * contracted: ISO C mode), so its bits are the numpy code's. softmax_f32 normalizes each row: the max
 * subtracted, expf, the float32 sum, one division per element (the sum's order differs from numpy's
 * pairwise one by rounding only). Both are plain loops the compiler vectorizes for the baseline ISA:
 * one build, the same values at every dispatch level. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>

#include "encoder_act.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h> /* SSE2: the x86-64 baseline, so one build serves every level */
#define EA_SSE2 1
#endif

/* activation.py's _ERF_P / _ERF_Q, rounded from double to float32 as numpy does */
#define F(c) ((float)(c))
static const float ERF_P[7] = {F(-2.72614225801306e-10), F(2.77068142495902e-08), F(-2.10102402082508e-06),
                               F(-5.69250639462346e-05), F(-7.34990630326855e-04), F(-2.95459980854025e-03),
                               F(-1.60960333262415e-02)};
static const float ERF_Q[5] = {F(-1.45660718464996e-05), F(-2.13374055278905e-04), F(-1.68282697438203e-03),
                               F(-7.37332916720468e-03), F(-1.42647390514189e-02)};
#undef F

static void erf_rows(const float *restrict x, float *restrict y, Py_ssize_t n)
{
    const float p0 = ERF_P[0], p1 = ERF_P[1], p2 = ERF_P[2], p3 = ERF_P[3], p4 = ERF_P[4], p5 = ERF_P[5];
    const float p6 = ERF_P[6], q0 = ERF_Q[0], q1 = ERF_Q[1], q2 = ERF_Q[2], q3 = ERF_Q[3], q4 = ERF_Q[4];
    Py_ssize_t i = 0;
#ifdef EA_SSE2
#define S(c) _mm_set1_ps(c)
    for (; i + 4 <= n; i += 4) {
        /* minps/maxps return their second operand when either is NaN: NaN passes, as np.clip lets it */
        const __m128 v = _mm_max_ps(S(-4.0f), _mm_min_ps(S(4.0f), _mm_loadu_ps(x + i)));
        const __m128 x2 = _mm_mul_ps(v, v);
        __m128 p = _mm_add_ps(_mm_mul_ps(S(p0), x2), S(p1));
        p = _mm_add_ps(_mm_mul_ps(p, x2), S(p2));
        p = _mm_add_ps(_mm_mul_ps(p, x2), S(p3));
        p = _mm_add_ps(_mm_mul_ps(p, x2), S(p4));
        p = _mm_add_ps(_mm_mul_ps(p, x2), S(p5));
        p = _mm_add_ps(_mm_mul_ps(p, x2), S(p6));
        __m128 q = _mm_add_ps(_mm_mul_ps(S(q0), x2), S(q1));
        q = _mm_add_ps(_mm_mul_ps(q, x2), S(q2));
        q = _mm_add_ps(_mm_mul_ps(q, x2), S(q3));
        q = _mm_add_ps(_mm_mul_ps(q, x2), S(q4));
        _mm_storeu_ps(y + i, _mm_div_ps(_mm_mul_ps(v, p), q));
    }
#undef S
#endif
    for (; i < n; i++) {
        float v = x[i];
        v = v > 4.0f ? 4.0f : v; /* NaN passes */
        v = v < -4.0f ? -4.0f : v;
        const float x2 = v * v;
        float p = p0 * x2 + p1;
        p = p * x2 + p2;
        p = p * x2 + p3;
        p = p * x2 + p4;
        p = p * x2 + p5;
        p = p * x2 + p6;
        float q = q0 * x2 + q1;
        q = q * x2 + q2;
        q = q * x2 + q3;
        q = q * x2 + q4;
        y[i] = v * p / q;
    }
}

/* The exact GELU of an exported graph, Mul(Mul(x, Add(Erf(Div(x, d)), a)), m) (d = sqrt 2, a = 1, m = 0.5 as
 * torch writes it), in those float32 operations and that order: the fused node gives the unfused graph's
 * bits. Blocks of 256 through erf_rows. */
static void gelu_rows(const float *restrict x, float *restrict y, Py_ssize_t n, float d, float a, float m)
{
    float t[256], e[256];
    for (Py_ssize_t i0 = 0; i0 < n; i0 += 256) {
        const Py_ssize_t k = n - i0 < 256 ? n - i0 : 256;
        for (Py_ssize_t i = 0; i < k; i++) t[i] = x[i0 + i] / d;
        erf_rows(t, e, k);
        for (Py_ssize_t i = 0; i < k; i++) y[i0 + i] = (x[i0 + i] * (e[i] + a)) * m;
    }
}

static void softmax_rows(const float *x, float *y, Py_ssize_t rows, Py_ssize_t n)
{
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = xr[0];
        for (Py_ssize_t i = 1; i < n && m == m; i++) m = xr[i] > m || xr[i] != xr[i] ? xr[i] : m; /* NaN wins */
        float s = 0.0f;
        for (Py_ssize_t i = 0; i < n; i++) {
            yr[i] = expf(xr[i] - m);
            s += yr[i];
        }
        for (Py_ssize_t i = 0; i < n; i++) yr[i] /= s;
    }
}

static int views(PyObject *const *args, Py_buffer *bx, Py_buffer *by, Py_ssize_t n, const char *who)
{
    if (PyObject_GetBuffer(args[0], bx, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(args[1], by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(bx);
        return -1;
    }
    if (n < 0 || bx->len != 4 * n || by->len != 4 * n) {
        PyBuffer_Release(bx);
        PyBuffer_Release(by);
        PyErr_Format(PyExc_ValueError, "%s: x and y must hold the same float32 elements", who);
        return -1;
    }
    return 0;
}

/* erf_f32(x, y, n) -> None */
PyObject *py_erf_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "erf_f32 takes 3 positional arguments");
        return NULL;
    }
    const Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_buffer bx, by;
    if (views(args, &bx, &by, n, "erf_f32") < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    erf_rows((const float *)bx.buf, (float *)by.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    Py_RETURN_NONE;
}

/* softmax_f32(x, y, rows, n) -> None; x and y [rows, n], y may not alias x */
PyObject *py_softmax_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "softmax_f32 takes 4 positional arguments");
        return NULL;
    }
    const Py_ssize_t rows = PyLong_AsSsize_t(args[2]), n = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 0 || n < 1 || rows > PY_SSIZE_T_MAX / 4 / n) {
        PyErr_SetString(PyExc_ValueError, "softmax_f32: bad rows/n");
        return NULL;
    }
    Py_buffer bx, by;
    if (views(args, &bx, &by, rows * n, "softmax_f32") < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    softmax_rows((const float *)bx.buf, (float *)by.buf, rows, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    Py_RETURN_NONE;
}

/* gelu_erf_f32(x, y, n, d, a, m) -> None; y may not alias x */
PyObject *py_gelu_erf_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "gelu_erf_f32 takes 6 positional arguments");
        return NULL;
    }
    const Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    const double d = PyFloat_AsDouble(args[3]), a = PyFloat_AsDouble(args[4]), m = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer bx, by;
    if (views(args, &bx, &by, n, "gelu_erf_f32") < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    gelu_rows((const float *)bx.buf, (float *)by.buf, n, (float)d, (float)a, (float)m);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    Py_RETURN_NONE;
}
