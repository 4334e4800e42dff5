/* LayerNormalization over the rows of a float32 matrix, optionally of h = x + skip (the Add + LayerNorm
 * fusion of resolve/fusions.py), in the form of onnxruntime's CPU LayerNorm (layer_norm_impl.cc): one
 * pass of sums of h and h * h, mean = sum / n, ms = sqrt(sumsq / n - mean * mean + eps),
 * y = (h - mean) / ms * gamma (+ beta), and the statistics mean and 1 / ms. The sums are double, the mean
 * rounded once from sum / n: that is onnxruntime 1.32's mean, bit for bit, on this machine (its float
 * sums of an older release are not); its ms and y differ from ours by an ulp now and then (its order
 * there is not known to us), and double sums keep the one-pass variance free of float cancellation.
 * One build for every dispatch level: the serial sums do not vectorize, the elementwise loop vectorizes
 * to the same bits at any width. Four rows at a time keep four independent sum chains in flight; large
 * calls split over the pool by rows (a row's result does not depend on the split). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "encoder_norm.h"
#include "pool.h"

typedef struct {
    const float *x, *skip, *gamma, *beta;
    float *y, *sum, *mean, *inv;
    long rows, n, rows_per_task, skip_rows; /* row r adds skip row r % skip_rows (a broadcast skip) */
    float eps;
} ln_job;

/* rows [r0, r0 + nr), nr <= 4 */
static void ln_rows(const ln_job *j, long r0, int nr)
{
    const long n = j->n;
    const float *h[4];
    for (int q = 0; q < nr; q++) {
        const long r = r0 + q;
        h[q] = j->x + r * n;
        if (j->skip) {
            const float *restrict a = j->x + r * n, *restrict b = j->skip + (r % j->skip_rows) * n;
            float *restrict s = j->sum + r * n;
            for (long i = 0; i < n; i++) s[i] = a[i] + b[i];
            h[q] = s;
        }
    }
    double m[4] = {0.0, 0.0, 0.0, 0.0}, ss[4] = {0.0, 0.0, 0.0, 0.0};
    if (nr == 4) {
        const float *h0 = h[0], *h1 = h[1], *h2 = h[2], *h3 = h[3];
        double m0 = 0.0, m1 = 0.0, m2 = 0.0, m3 = 0.0, s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (long i = 0; i < n; i++) {
            const double a0 = h0[i], a1 = h1[i], a2 = h2[i], a3 = h3[i];
            m0 += a0, s0 += a0 * a0;
            m1 += a1, s1 += a1 * a1;
            m2 += a2, s2 += a2 * a2;
            m3 += a3, s3 += a3 * a3;
        }
        m[0] = m0, m[1] = m1, m[2] = m2, m[3] = m3, ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
    } else {
        for (int q = 0; q < nr; q++) {
            double m0 = 0.0, s0 = 0.0;
            for (long i = 0; i < n; i++) {
                const double a = h[q][i];
                m0 += a, s0 += a * a;
            }
            m[q] = m0, ss[q] = s0;
        }
    }
    for (int q = 0; q < nr; q++) {
        const double md = m[q] / (double)n;
        const float mean = (float)md;
        const float ms = (float)sqrt(ss[q] / (double)n - md * md + (double)j->eps);
        const float *restrict hq = h[q], *restrict g = j->gamma, *restrict b = j->beta;
        float *restrict y = j->y + (r0 + q) * n;
        if (b)
            for (long i = 0; i < n; i++) y[i] = (hq[i] - mean) / ms * g[i] + b[i];
        else
            for (long i = 0; i < n; i++) y[i] = (hq[i] - mean) / ms * g[i];
        if (j->mean) j->mean[r0 + q] = mean;
        if (j->inv) j->inv[r0 + q] = 1.0f / ms;
    }
}

static void ln_task(void *ctx, int t)
{
    const ln_job *j = (const ln_job *)ctx;
    const long r0 = (long)t * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    for (long r = r0; r < r1; r += 4) ln_rows(j, r, r1 - r < 4 ? (int)(r1 - r) : 4);
}

static int view(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    memset(v, 0, sizeof *v);
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len != need) {
        PyErr_Format(PyExc_ValueError, "layer_norm_f32: %s holds %zd bytes, expected %zd", name, v->len, need);
        PyBuffer_Release(v);
        v->obj = NULL;
        return -1;
    }
    return 0;
}

/* layer_norm_f32(x, skip|None, gamma, beta|None, y, sum|None, mean|None, inv|None, rows, n, eps, skip_rows):
 * float32, C-contiguous; x, y, sum [rows, n]; skip [skip_rows, n] (skip_rows divides rows: row r adds skip
 * row r % skip_rows, numpy's broadcast of a skip over leading dimensions); gamma, beta [n]; mean, inv
 * [rows]; skip and sum only together. y and sum may not alias the inputs. */
PyObject *py_layer_norm_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "layer_norm_f32 takes 12 positional arguments");
        return NULL;
    }
    const long rows = PyLong_AsLong(args[8]), n = PyLong_AsLong(args[9]);
    const double eps = PyFloat_AsDouble(args[10]);
    const long skip_rows = PyLong_AsLong(args[11]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 0 || n < 1 || rows > (1L << 40) / n || skip_rows < 1 || (rows && (skip_rows > rows || rows % skip_rows))) {
        PyErr_SetString(PyExc_ValueError, "layer_norm_f32: bad rows/n");
        return NULL;
    }
    const Py_ssize_t mat = 4 * (Py_ssize_t)rows * n;
    Py_buffer b[8];
    const char *names[8] = {"x", "skip", "gamma", "beta", "y", "sum", "mean", "inv"};
    const Py_ssize_t need[8] = {mat, 4 * (Py_ssize_t)skip_rows * n, 4 * n, 4 * n, mat, mat, 4 * rows, 4 * rows};
    PyObject *ret = NULL;
    int got = 0;
    for (; got < 8; got++)
        if (view(args[got], &b[got], got >= 4, need[got], names[got]) < 0) goto done;
    if (!b[0].obj || !b[2].obj || !b[4].obj || !b[1].obj != !b[5].obj) {
        PyErr_SetString(PyExc_ValueError, "layer_norm_f32: x, gamma and y are required; skip and sum go together");
        goto done;
    }
    ln_job j = {(const float *)b[0].buf, (const float *)b[1].buf, (const float *)b[2].buf, (const float *)b[3].buf,
                (float *)b[4].buf, (float *)b[5].buf, (float *)b[6].buf, (float *)b[7].buf, rows, n, rows,
                skip_rows, (float)eps};
    /* 16 Ki elements per task, rounded to whole blocks of 4 rows (as rms_norm) */
    const long per = (1L << 14) / n > 4 ? (1L << 14) / n / 4 * 4 : 4;
    const int ntasks = (int)((rows + per - 1) / per);
    j.rows_per_task = ntasks > 1 ? per : rows;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1)
        nb_pool_run(ln_task, &j, ntasks);
    else
        ln_task(&j, 0);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
