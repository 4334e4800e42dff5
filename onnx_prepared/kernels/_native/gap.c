/* GlobalAveragePool of float32 planes: y[p] = sum(x[p * L .. (p+1) * L]) / L, one call, GIL released
 * (and GlobalMaxPool's max of each plane, NaN propagating as numpy's maximum.reduce).
 * SE blocks pool hundreds of small planes (2x2 .. 16x16) per run; numpy's mean costs more in its
 * wrapper than in the reduction. Eight interleaved partial sums (vectorised at any level, no
 * reassociation needed), summed pairwise at the end. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gap.h"

static float plane_mean(const float *x, Py_ssize_t L)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= L; i += 8)
        for (int t = 0; t < 8; t++) acc[t] += x[i + t];
    float tail = 0.0f;
    for (; i < L; i++) tail += x[i];
    const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
    return s / (float)L;
}

/* the plane's maximum; a NaN anywhere makes it NaN */
static float plane_max(const float *x, Py_ssize_t L)
{
    float m[8];
    Py_ssize_t i = 0;
    int nan = 0;
    for (int t = 0; t < 8; t++) m[t] = x[0];
    for (; i + 8 <= L; i += 8)
        for (int t = 0; t < 8; t++) {
            const float v = x[i + t];
            nan |= v != v;
            m[t] = v > m[t] ? v : m[t];
        }
    float r = m[0];
    for (int t = 1; t < 8; t++) r = m[t] > r ? m[t] : r;
    for (; i < L; i++) {
        nan |= x[i] != x[i];
        r = x[i] > r ? x[i] : r;
    }
    if (nan)
        for (i = 0; i < L; i++)
            if (x[i] != x[i]) return x[i]; /* the first NaN, as numpy's reduction returns it */
    return r;
}

/* fn(x, y, planes, L): y[p] = reduce(x[p * L .. (p+1) * L]) for float32 x [planes * L], y [planes];
 * the argument checks global_avg and global_max share */
static PyObject *per_plane(PyObject *const *args, Py_ssize_t nargs, const char *fn,
                           float (*reduce)(const float *, Py_ssize_t))
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s takes 4 positional arguments", fn);
        return NULL;
    }
    const Py_ssize_t planes = PyLong_AsSsize_t(args[2]), L = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (planes < 0 || L < 1) {
        PyErr_Format(PyExc_ValueError, "%s: bad planes or plane size", fn);
        return NULL;
    }
    Py_buffer bx, by;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&bx);
        return NULL;
    }
    PyObject *ret = NULL;
    if (bx.len / 4 / L < planes || by.len / 4 < planes) {
        PyErr_Format(PyExc_ValueError, "%s: a buffer is smaller than its shape", fn);
    } else {
        const float *x = (const float *)bx.buf;
        float *y = (float *)by.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < planes; p++) y[p] = reduce(x + p * L, L);
        Py_END_ALLOW_THREADS
        ret = Py_None;
        Py_INCREF(ret);
    }
    PyBuffer_Release(&by);
    PyBuffer_Release(&bx);
    return ret;
}

PyObject *py_global_avg(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return per_plane(args, nargs, "global_avg", plane_mean);
}

PyObject *py_global_max(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return per_plane(args, nargs, "global_max", plane_max);
}
