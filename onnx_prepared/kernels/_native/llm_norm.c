/* RMS norm over the rows of a float32 matrix, optionally of x + skip (+ bias) (SimplifiedLayerNormalization,
 * SkipSimplifiedLayerNormalization, RMSNormalization): per row h = x (+ skip + bias), inv = 1 / sqrt(mean(h^2)
 * + eps), y = h * inv * gamma, and the sum h when asked. One pass per row with the same float32 operations as
 * the numpy code (the mean square keeps 16 partial sums: a fixed order, so the result does not depend on the
 * thread count). Memory-bound: one portable build, vectorized by the compiler; large calls split over the
 * pool by rows. */
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

enum { LANES = 16 };

static void add_row(float *restrict out, const float *restrict x, const float *restrict s,
                    const float *restrict bias, long n)
{
    if (bias)
        for (long i = 0; i < n; i++) out[i] = (x[i] + s[i]) + bias[i];
    else
        for (long i = 0; i < n; i++) out[i] = x[i] + s[i];
}

static void scale_row(float *restrict y, const float *restrict h, const float *restrict g, float inv, long n)
{
    for (long k = 0; k < n; k++) y[k] = (h[k] * inv) * g[k];
}

static void norm_row(const norm_job *j, long r)
{
    const long n = j->n;
    const float *h = j->x + r * n;
    if (j->skip) {
        add_row(j->sum + r * n, h, j->skip + r * n, j->bias, n);
        h = j->sum + r * n;
    }
    float part[LANES] = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) part[l] += h[i + l] * h[i + l];
    float ss = 0.0f;
    for (; i < n; i++) ss += h[i] * h[i];
    for (int l = 0; l < LANES; l++) ss += part[l];
    const float inv = 1.0f / sqrtf(ss / (float)n + j->eps);
    if (j->inv) j->inv[r] = inv;
    scale_row(j->y + r * n, h, j->gamma, inv, n);
}

static void norm_task(void *ctx, int t)
{
    const norm_job *j = (const norm_job *)ctx;
    const long r0 = (long)t * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    for (long r = r0; r < r1; r++) norm_row(j, r);
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
    /* 64 Ki elements per task: a pool hand-off costs about what a small row block does */
    const long per = (1L << 16) / n > 0 ? (1L << 16) / n : 1;
    const int ntasks = (int)((rows + per - 1) / per);
    j.rows_per_task = per;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1)
        nb_pool_run(norm_task, &j, ntasks);
    else
        for (long r = 0; r < rows; r++) norm_row(&j, r);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
