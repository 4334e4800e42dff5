/* NonMaxSuppression's greedy pass for one (batch, class): candidates in score order, each kept unless a
 * kept box overlaps it by IoU > threshold (float32 arithmetic in the order kernels/detection.py's
 * numpy path uses, so both select the same boxes; IoU is symmetric in that arithmetic). A candidate is
 * compared with the kept boxes only, as onnxruntime does: the pass ends once max_out are kept. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "nms.h"

static float minf(float a, float b) { return a < b ? a : b; }
static float maxf(float a, float b) { return a > b ? a : b; }

static long greedy(const float *y1, const float *x1, const float *y2, const float *x2, const float *area,
                   const int64_t *order, long n, long max_out, float iou_t, int64_t *kept)
{
    long nk = 0;
    for (long p = 0; p < n && nk < max_out; p++) {
        const int64_t r = order[p];
        int keep = 1;
        for (long q = 0; q < nk && keep; q++) { /* against the kept boxes only: stops at max_out kept */
            const int64_t i = kept[q];
            const float ih = minf(y2[i], y2[r]) - maxf(y1[i], y1[r]);
            const float iw = minf(x2[i], x2[r]) - maxf(x1[i], x1[r]);
            const float inter = maxf(ih, 0.0f) * maxf(iw, 0.0f);
            const float uni = area[i] + area[r] - inter;
            float iou = 0.0f;
            if (area[i] > 0.0f && area[r] > 0.0f) iou = inter / (uni > 0.0f ? uni : 1.0f);
            keep = !(iou > iou_t);
        }
        if (keep) kept[nk++] = r;
    }
    return nk;
}

/* nms_greedy(coords float32[5][N] (y1 x1 y2 x2 area), order int64[n], max_out, iou_t, kept int64[n])
 * -> number kept */
PyObject *py_nms_greedy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "nms_greedy takes 5 positional arguments");
        return NULL;
    }
    const long max_out = PyLong_AsLong(args[2]);
    if (max_out == -1 && PyErr_Occurred()) return NULL;
    const double t = PyFloat_AsDouble(args[3]);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer bc, bo, bk;
    if (PyObject_GetBuffer(args[0], &bc, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &bo, PyBUF_C_CONTIGUOUS) < 0) goto f0;
    if (PyObject_GetBuffer(args[4], &bk, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto f1;
    PyObject *ret = NULL;
    const long N = (long)(bc.len / (5 * 4)), n = (long)(bo.len / 8);
    const int64_t *order = (const int64_t *)bo.buf;
    int ok = bc.len == (Py_ssize_t)N * 20 && bk.len >= 8 * (Py_ssize_t)n;
    for (long p = 0; ok && p < n; p++) ok = order[p] >= 0 && order[p] < N;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "nms_greedy: bad coordinates, order or output buffer");
    } else {
        const float *c = (const float *)bc.buf;
        long nk;
        Py_BEGIN_ALLOW_THREADS
        nk = greedy(c, c + N, c + 2 * N, c + 3 * N, c + 4 * N, order, n, max_out, (float)t, (int64_t *)bk.buf);
        Py_END_ALLOW_THREADS
        ret = PyLong_FromLong(nk);
    }
    PyBuffer_Release(&bk);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bc);
    return ret;
f1:
    PyBuffer_Release(&bo);
f0:
    PyBuffer_Release(&bc);
    return NULL;
}
