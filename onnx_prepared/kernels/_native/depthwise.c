/* 2-D depthwise Conv (one input channel per group, any channel multiplier), NCHW float32, over the pool.
 * Output channel c*mult + j reads input channel c with weight row w[c][j][KH*KW]; pads are bounds on
 * each tap's valid output columns (no padded copy). Tasks are fixed blocks of output planes, so the
 * result does not depend on the thread count; the portable C loop vectorizes over output columns at
 * stride 1. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "depthwise.h"
#include "pool.h"

typedef struct {
    const float *x, *w, *b;
    float *y;
    long N, C, H, W, mult, KH, KW, OH, OW, pt, pl, sh, sw, dh, dw, planes_per_task;
} dw_job;

static long ceil_div(long a, long b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

static void plane(const dw_job *j, long n, long oc)
{
    const long c = oc / j->mult, K = j->KH * j->KW;
    const float *x = j->x + ((size_t)n * j->C + c) * j->H * j->W;
    const float *w = j->w + (size_t)oc * K;
    float *y = j->y + ((size_t)n * j->C * j->mult + oc) * j->OH * j->OW;
    const float bias = j->b ? j->b[oc] : 0.0f;
    for (long oh = 0; oh < j->OH; oh++) {
        float *yr = y + (size_t)oh * j->OW;
        for (long ow = 0; ow < j->OW; ow++) yr[ow] = bias;
        for (long ki = 0; ki < j->KH; ki++) {
            const long ih = oh * j->sh - j->pt + ki * j->dh;
            if (ih < 0 || ih >= j->H) continue;
            const float *xr = x + (size_t)ih * j->W;
            for (long kj = 0; kj < j->KW; kj++) {
                const long off = kj * j->dw - j->pl; /* iw = ow * sw + off */
                long lo = ceil_div(-off, j->sw), hi = ceil_div(j->W - off, j->sw);
                if (lo < 0) lo = 0;
                if (hi > j->OW) hi = j->OW;
                const float wv = w[ki * j->KW + kj];
                if (j->sw == 1) {
                    const float *xs = xr + off;
                    for (long ow = lo; ow < hi; ow++) yr[ow] += wv * xs[ow];
                } else {
                    for (long ow = lo; ow < hi; ow++) yr[ow] += wv * xr[ow * j->sw + off];
                }
            }
        }
    }
}

static void dw_task(void *ctx, int t)
{
    const dw_job *j = (const dw_job *)ctx;
    const long M = j->C * j->mult, total = j->N * M;
    const long p0 = (long)t * j->planes_per_task;
    const long p1 = p0 + j->planes_per_task < total ? p0 + j->planes_per_task : total;
    for (long p = p0; p < p1; p++) plane(j, p / M, p % M);
}

/* depthwise2d(x, w, b|None, y, dims int64[15]): dims = N C H W mult KH KW OH OW pt pl sh sw dh dw */
PyObject *py_depthwise2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "depthwise2d takes 5 positional arguments");
        return NULL;
    }
    Py_buffer bd, bx, bw, bb, by;
    memset(&bb, 0, sizeof bb);
    if (PyObject_GetBuffer(args[4], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_w = 0, have_y = 0;
    if (bd.len < 15 * 8) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: dims needs 15 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    dw_job j = {NULL, NULL, NULL, NULL, (long)d[0], (long)d[1], (long)d[2], (long)d[3], (long)d[4], (long)d[5],
                (long)d[6], (long)d[7], (long)d[8], (long)d[9], (long)d[10], (long)d[11], (long)d[12],
                (long)d[13], (long)d[14], 1};
    int bad = 0;
    for (int i = 0; i < 15; i++) bad |= d[i] < (i == 9 || i == 10 ? 0 : 1) || d[i] > (1LL << 30);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: bad dims");
        goto done;
    }
    const Py_ssize_t M = j.C * j.mult, K = j.KH * j.KW;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &bw, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_w = 1;
    if (args[2] != Py_None && PyObject_GetBuffer(args[2], &bb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[3], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    if (bx.len < 4 * (Py_ssize_t)j.N * j.C * j.H * j.W || bw.len < 4 * M * K || (bb.obj && bb.len < 4 * M) ||
        by.len < 4 * (Py_ssize_t)j.N * M * j.OH * j.OW) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: a buffer is smaller than its shape");
        goto done;
    }
    j.x = (const float *)bx.buf;
    j.w = (const float *)bw.buf;
    j.b = bb.obj ? (const float *)bb.buf : NULL;
    j.y = (float *)by.buf;
    const long total = j.N * M, per_plane = j.OH * j.OW * K;
    /* about 2^15 multiply-adds per task, fixed by the shape */
    j.planes_per_task = per_plane >= (1 << 15) ? 1 : (1 << 15) / (per_plane ? per_plane : 1);
    const int ntasks = (int)((total + j.planes_per_task - 1) / j.planes_per_task);
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1 && nb_pool_get_threads() > 1)
        nb_pool_run(dw_task, &j, ntasks);
    else
        for (int t = 0; t < ntasks; t++) dw_task(&j, t);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_y) PyBuffer_Release(&by);
    if (bb.obj) PyBuffer_Release(&bb);
    if (have_w) PyBuffer_Release(&bw);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}
