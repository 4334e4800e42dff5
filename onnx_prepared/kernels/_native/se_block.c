/* A squeeze-and-excitation block (kernels/squeeze_excite.py) in one call, float32:
 *   s = mean of each [n, c] plane of x;  h = relu(W1 s + b1);  g = clip(alpha (W2 h + b2) + beta, 0, 1);
 *   y[n, c, :] = x[n, c, :] * g[c]
 * with W1 [Cr, C] and W2 [C, Cr] given transposed (w1t [C, Cr], w2t [Cr, C], the prepacked layout of
 * kernels/squeeze_excite.py). The vectors are short (C up to a few thousand): one thread, the same
 * value for any thread count and at every dispatch level (se_block.inc, built per ISA in
 * se_block_isa.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "rnn_module.h"
#include "se_block.h"

static void (*const g_levels[3])(const se_job *) = {se_run_portable, se_run_avx2, se_run_avx512};

/* se_block(x, w1t, b1|None, w2t, b2|None, y, dims int64[4] = N C P Cr, alpha, beta) */
PyObject *py_se_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "se_block takes 9 positional arguments");
        return NULL;
    }
    const double alpha = PyFloat_AsDouble(args[7]), beta = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer bd, bx, bw1, bb1, bw2, bb2, by;
    memset(&bb1, 0, sizeof bb1);
    memset(&bb2, 0, sizeof bb2);
    if (PyObject_GetBuffer(args[6], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_w1 = 0, have_w2 = 0, have_y = 0;
    float *buf = NULL;
    if (bd.len < 4 * 8) {
        PyErr_SetString(PyExc_ValueError, "se_block: dims needs 4 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    for (int i = 0; i < 4; i++)
        if (d[i] < 1 || d[i] > (1LL << 30)) {
            PyErr_SetString(PyExc_ValueError, "se_block: bad dims");
            goto done;
        }
    const long N = (long)d[0], C = (long)d[1], P = (long)d[2], R = (long)d[3];
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &bw1, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_w1 = 1;
    if (args[2] != Py_None && PyObject_GetBuffer(args[2], &bb1, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[3], &bw2, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_w2 = 1;
    if (args[4] != Py_None && PyObject_GetBuffer(args[4], &bb2, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[5], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    const double total = (double)N * C * P;
    if ((double)bx.len < 4 * total || (double)by.len < 4 * total || bw1.len < 4 * (Py_ssize_t)R * C ||
        bw2.len < 4 * (Py_ssize_t)R * C || (bb1.obj && bb1.len < 4 * R) || (bb2.obj && bb2.len < 4 * C)) {
        PyErr_SetString(PyExc_ValueError, "se_block: a buffer is smaller than its shape");
        goto done;
    }
    buf = (float *)malloc((size_t)(2 * C + R) * sizeof(float));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    se_job j = {(const float *)bx.buf, (const float *)bw1.buf, bb1.obj ? (const float *)bb1.buf : NULL,
                (const float *)bw2.buf, bb2.obj ? (const float *)bb2.buf : NULL, (float *)by.buf, buf,
                N, C, P, R, (float)alpha, (float)beta};
    const int level = ext_isa_level();
    void (*run)(const se_job *) = g_levels[level >= 3 ? 2 : level >= 1 ? 1 : 0];
    Py_BEGIN_ALLOW_THREADS
    run(&j);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    free(buf);
    if (have_y) PyBuffer_Release(&by);
    if (bb2.obj) PyBuffer_Release(&bb2);
    if (have_w2) PyBuffer_Release(&bw2);
    if (bb1.obj) PyBuffer_Release(&bb1);
    if (have_w1) PyBuffer_Release(&bw1);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}
