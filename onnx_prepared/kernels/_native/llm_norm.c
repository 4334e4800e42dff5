/* RMS norm over the rows of a float32 matrix, optionally of x + skip (+ bias) (SimplifiedLayerNormalization,
 * SkipSimplifiedLayerNormalization, RMSNormalization), in the float32 operations and order onnxruntime's CPU
 * kernels use, so that the outputs are its bits (an int8-quantized MatMulNBits after the norm amplifies a
 * last-bit difference into a rounding flip): h = x (+ skip + bias), ms = sqrt(sum of h^2 / n + eps), the
 * sum h when asked. No contraction (ISO C mode). One portable build; large calls split over the pool by rows
 * (a row's result does not depend on the split). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "llm_norm.h"
#include "pool.h"

typedef struct {
    const float *x, *skip, *bias, *gamma;
    float *y, *sum, *inv;
    long rows, n, rows_per_task;
    float eps;
} norm_job;

/* The plain norm (no skip), as onnxruntime's SimplifiedLayerNormalization computes it on an AVX2+FMA
 * machine (matched bit for bit, tests/kernels/test_normalization.py): from PLAIN_VEC_MIN channels on, 8 lanes
 * of fused h * h + acc over the whole blocks of 8, reduced by halving (4 + 4, 2 + 2, 1 + 1), then the tail
 * fused into that sum one by one; inv = 1 / sqrt(sum / n + eps), y = h * inv * gamma. Below, a serial
 * unfused sum and y = h / ms * gamma. A fused multiply-add here is a double product and sum rounded once to
 * float (the product of two floats is exact in a double; the sum differs from the fused result only on a
 * double-rounding tie, ~2^-29 of the cases), so every dispatch level gives the same bits. */
enum { PLAIN_VEC_MIN = 16 };

static inline float fused_sq(float h, float acc) { return (float)((double)h * h + acc); }

static void plain_row(const norm_job *j, long r)
{
    const long n = j->n;
    const float *restrict h = j->x + r * n;
    float *restrict y = j->y + r * n;
    if (n < PLAIN_VEC_MIN) {
        float ss = 0.0f;
        for (long i = 0; i < n; i++) ss += h[i] * h[i];
        const float ms = sqrtf(ss / (float)n + j->eps);
        if (j->inv) j->inv[r] = 1.0f / ms;
        for (long k = 0; k < n; k++) y[k] = h[k] / ms * j->gamma[k];
        return;
    }
    float acc[8] = {0};
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] = fused_sq(h[i + l], acc[l]);
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    acc[0] += acc[2];
    acc[1] += acc[3];
    float ss = acc[0] + acc[1];
    for (; i < n; i++) ss = fused_sq(h[i], ss);
    const float inv = 1.0f / sqrtf(ss / (float)n + j->eps);
    if (j->inv) j->inv[r] = inv;
    for (long k = 0; k < n; k++) y[k] = h[k] * inv * j->gamma[k];
}

static void add_row(float *restrict out, const float *restrict x, const float *restrict s,
                    const float *restrict bias, long n)
{
    if (bias)
        for (long i = 0; i < n; i++) out[i] = (x[i] + s[i]) + bias[i];
    else
        for (long i = 0; i < n; i++) out[i] = x[i] + s[i];
}

static void scale_row(float *restrict y, const float *restrict h, const float *restrict g, float ms, long n)
{
    for (long k = 0; k < n; k++) y[k] = h[k] / ms * g[k];
}

/* The skip norm, rows [r0, r0 + nr), nr <= 4, as onnxruntime's SkipSimplifiedLayerNormalization (its
 * ComputeJob, matched bit for bit): the sums of squares are serial (nr independent chains hide each one's
 * latency), y = h / ms * gamma. */
static void norm_rows(const norm_job *j, long r0, int nr)
{
    const long n = j->n;
    const float *h[4];
    for (int q = 0; q < nr; q++) {
        const long r = r0 + q;
        h[q] = j->x + r * n;
        if (j->skip) {
            add_row(j->sum + r * n, h[q], j->skip + r * n, j->bias, n);
            h[q] = j->sum + r * n;
        }
    }
    float ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (nr == 4) {
        const float *h0 = h[0], *h1 = h[1], *h2 = h[2], *h3 = h[3];
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (long i = 0; i < n; i++) {
            s0 += h0[i] * h0[i];
            s1 += h1[i] * h1[i];
            s2 += h2[i] * h2[i];
            s3 += h3[i] * h3[i];
        }
        ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
    } else {
        for (int q = 0; q < nr; q++) {
            float s0 = 0.0f;
            for (long i = 0; i < n; i++) s0 += h[q][i] * h[q][i];
            ss[q] = s0;
        }
    }
    for (int q = 0; q < nr; q++) {
        const float ms = sqrtf(ss[q] / (float)n + j->eps);
        if (j->inv) j->inv[r0 + q] = 1.0f / ms;
        scale_row(j->y + (r0 + q) * n, h[q], j->gamma, ms, n);
    }
}

static void norm_task(void *ctx, int t)
{
    const norm_job *j = (const norm_job *)ctx;
    const long r0 = (long)t * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    if (!j->skip)
        for (long r = r0; r < r1; r++) plain_row(j, r);
    else
        for (long r = r0; r < r1; r += 4) norm_rows(j, r, r1 - r < 4 ? (int)(r1 - r) : 4);
}

static int view(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    memset(v, 0, sizeof *v);
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len != need) {
        PyErr_Format(PyExc_ValueError, "rms_norm: %s holds %zd bytes, expected %zd", name, v->len, need);
        PyBuffer_Release(v);
        v->obj = NULL;
        return -1;
    }
    return 0;
}

/* rms_norm(x, skip|None, bias|None, gamma, y, sum|None, inv|None, rows, n, eps): float32, C-contiguous;
 * x, skip, y, sum [rows, n]; bias, gamma [n]; inv [rows]; skip, bias and sum only together (bias optional).
 * y and sum may not alias the inputs. */
PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "rms_norm takes 10 positional arguments");
        return NULL;
    }
    const long rows = PyLong_AsLong(args[7]), n = PyLong_AsLong(args[8]);
    const double eps = PyFloat_AsDouble(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 0 || n < 1 || rows > (1L << 40) / n) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: bad rows/n");
        return NULL;
    }
    const Py_ssize_t mat = 4 * (Py_ssize_t)rows * n;
    Py_buffer b[7];
    const char *names[7] = {"x", "skip", "bias", "gamma", "y", "sum", "inv"};
    const Py_ssize_t need[7] = {mat, mat, 4 * n, 4 * n, mat, mat, 4 * rows};
    PyObject *ret = NULL;
    int got = 0;
    for (; got < 7; got++)
        if (view(args[got], &b[got], got >= 4, need[got], names[got]) < 0) goto done;
    if (!b[0].obj || !b[3].obj || !b[4].obj || !b[1].obj != !b[5].obj || (b[2].obj && !b[1].obj)) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: x, gamma and y are required; skip and sum go together");
        goto done;
    }
    norm_job j = {(const float *)b[0].buf, (const float *)b[1].buf, (const float *)b[2].buf, (const float *)b[3].buf,
                  (float *)b[4].buf, (float *)b[5].buf, (float *)b[6].buf, rows, n, rows, (float)eps};
    /* 16 Ki elements per task (4 rows of 4096): a hand-off costs about what such a block does, and small
     * tasks keep the caller busy when a worker is late (a shared machine) */
    const long per = (1L << 14) / n > 4 ? (1L << 14) / n / 4 * 4 : 4;
    const int ntasks = (int)((rows + per - 1) / per);
    j.rows_per_task = per;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1)
        nb_pool_run(norm_task, &j, ntasks);
    else
        norm_task(&j, 0);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
