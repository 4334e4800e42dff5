/* Bilinear Resize of the last two axes, float32, over the pool: onnxruntime's UpsampleBilinear sum with
 * the per-axis tables built by resize.py (_resize_linear.py) at binding. Tasks are fixed blocks of
 * planes (from the shape only), so the result does not depend on the thread count; the planes are
 * computed by resize.inc, built for portable, AVX2 and AVX-512 (resize_isa.c), chosen by the dispatch
 * level. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "pool.h"
#include "resize.h"
#include "rnn_module.h"

static void (*g_planes)(const rl_job *, int) = rl_planes_portable; /* set per call under the GIL */

static void rl_task(void *ctx, int t) { g_planes((const rl_job *)ctx, t); }

enum { RL_HEAD = 6 };

static int in_range(const long long *v, long n, long hi)
{
    int bad = 0;
    for (long i = 0; i < n; i++) bad |= v[i] < 0 || v[i] >= hi;
    return !bad;
}

/* resize_linear2d(x, y, itab int64, ftab float32):
 *   itab = P H W OH OW extrap, y1[OH] y2[OH] x1[OW] x2[OW] yout[OH] xout[OW]
 *   ftab = dy1[OH] dy2[OH] dx1[OW] dx2[OW] extrapolation_value */
PyObject *py_resize_linear2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "resize_linear2d takes 4 positional arguments");
        return NULL;
    }
    Py_buffer bi, bf, bx, by;
    if (PyObject_GetBuffer(args[2], &bi, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_f = 0, have_x = 0, have_y = 0;
    const long long *d = (const long long *)bi.buf;
    int bad = bi.len < RL_HEAD * 8 || bi.itemsize != 8;
    for (int i = 0; !bad && i < 5; i++) bad |= d[i] < 1 || d[i] > (1LL << 30);
    if (!bad) bad = bi.len != (Py_ssize_t)(8 * (RL_HEAD + 3 * d[3] + 3 * d[4]));
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "resize_linear2d: itab needs P H W OH OW extrap and 3 (OH + OW) int64 indices");
        goto done;
    }
    const long P = (long)d[0], H = (long)d[1], W = (long)d[2], OH = (long)d[3], OW = (long)d[4];
    const long long *y1 = d + RL_HEAD, *y2 = y1 + OH, *x1 = y2 + OH, *x2 = x1 + OW, *yout = x2 + OW,
                    *xout = yout + OH;
    if (!in_range(y1, 2 * OH, H) || !in_range(x1, 2 * OW, W)) {
        PyErr_SetString(PyExc_ValueError, "resize_linear2d: a row or column index is outside the input");
        goto done;
    }
    if (PyObject_GetBuffer(args[3], &bf, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_f = 1;
    if (bf.len != (Py_ssize_t)(4 * (2 * OH + 2 * OW + 1)) || bf.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "resize_linear2d: ftab needs 2 (OH + OW) + 1 float32 weights");
        goto done;
    }
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    if (bx.len < 4.0 * P * H * W || by.len < 4.0 * P * OH * OW || bx.itemsize != 4 || by.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "resize_linear2d: a buffer is smaller than its shape (float32)");
        goto done;
    }
    const float *f = (const float *)bf.buf;
    int failed = 0;
    rl_job j = {(const float *)bx.buf, (float *)by.buf, P, H, W, OH, OW, 1, y1, y2, x1, x2, yout, xout,
                f, f + OH, f + 2 * OH, f + 2 * OH + OW, f[2 * OH + 2 * OW], d[5] != 0, &failed};
    const long per_plane = OH * OW;
    /* about 2^14 outputs per task, fixed by the shape */
    j.planes_per_task = per_plane >= (1 << 14) ? 1 : (1 << 14) / per_plane;
    const int ntasks = (int)((P + j.planes_per_task - 1) / j.planes_per_task);
    const int level = ext_isa_level();
    g_planes = level >= 3 ? rl_planes_avx512 : level >= 1 ? rl_planes_avx2 : rl_planes_portable;
    Py_BEGIN_ALLOW_THREADS
    /* below ~2^17 outputs per call waking the pool costs more than it saves */
    if (ntasks > 1 && nb_pool_get_threads() > 1 && (double)P * per_plane >= (double)(1 << 17))
        nb_pool_run(rl_task, &j, ntasks);
    else
        for (int t = 0; t < ntasks; t++) rl_task(&j, t);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_y) PyBuffer_Release(&by);
    if (have_x) PyBuffer_Release(&bx);
    if (have_f) PyBuffer_Release(&bf);
    PyBuffer_Release(&bi);
    return ret;
}
