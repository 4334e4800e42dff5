/* 2-D MaxPool / AveragePool, NCHW float32, over the pool. Tasks are fixed blocks of output planes
 * (from the shape only), so the result does not depend on the thread count; the planes are computed by
 * winpool.inc, built for portable, AVX2 and AVX-512 (winpool_isa.c) and chosen by the dispatch level. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "rnn_module.h"
#include "winpool.h"

static void (*g_planes)(const wp_job *, int) = wp_planes_portable; /* set per call under the GIL */

static void wp_task(void *ctx, int t) { g_planes((const wp_job *)ctx, t); }

enum { WP_DIMS = 18 };

/* pool2d(x, y, dims int64[18]): dims = N C H W KH KW OH OW pt pl pb pr sh sw dh dw avg include_pad */
PyObject *py_pool2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pool2d takes 3 positional arguments");
        return NULL;
    }
    Py_buffer bd, bx, by;
    if (PyObject_GetBuffer(args[2], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_y = 0;
    if (bd.len < WP_DIMS * 8) {
        PyErr_SetString(PyExc_ValueError, "pool2d: dims needs 18 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    int bad = 0;
    /* N C H W KH KW OH OW >= 1, pads >= 0, strides and dilations >= 1, flags 0/1 */
    for (int i = 0; i < WP_DIMS; i++) {
        const long long lo = (i >= 8 && i < 12) || i >= 16 ? 0 : 1;
        bad |= d[i] < lo || d[i] > (1LL << 30);
    }
    bad |= d[16] > 1 || d[17] > 1;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "pool2d: bad dims");
        goto done;
    }
    int failed = 0;
    wp_job j = {NULL, NULL, (long)d[0], (long)d[1], (long)d[2], (long)d[3], (long)d[4], (long)d[5], (long)d[6],
                (long)d[7], (long)d[8], (long)d[9], (long)d[10], (long)d[11], (long)d[12], (long)d[13],
                (long)d[14], (long)d[15], 1, (int)d[16], (int)d[17], &failed};
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    const double planes = (double)j.N * (double)j.C;
    if ((double)bx.len < 4.0 * planes * j.H * j.W || (double)by.len < 4.0 * planes * j.OH * j.OW) {
        PyErr_SetString(PyExc_ValueError, "pool2d: a buffer is smaller than its shape");
        goto done;
    }
    j.x = (const float *)bx.buf;
    j.y = (float *)by.buf;
    const long total = j.N * j.C, per_plane = j.OH * j.OW * j.KH * j.KW;
    /* about 2^15 taps per task, fixed by the shape */
    j.planes_per_task = per_plane >= (1 << 15) ? 1 : (1 << 15) / (per_plane ? per_plane : 1);
    const int ntasks = (int)((total + j.planes_per_task - 1) / j.planes_per_task);
    const int level = ext_isa_level();
    g_planes = level >= 3 ? (wp_max_direct_ok(&j) ? wp_planes_max_avx512 : wp_planes_avx512)
               : level >= 1 ? wp_planes_avx2 : wp_planes_portable;
    Py_BEGIN_ALLOW_THREADS
    /* below ~2^18 taps per call waking the pool costs more than it saves */
    if (ntasks > 1 && nb_pool_get_threads() > 1 && (double)total * (double)per_plane >= (double)(1 << 18))
        nb_pool_run(wp_task, &j, ntasks);
    else
        for (int t = 0; t < ntasks; t++) wp_task(&j, t);
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
    PyBuffer_Release(&bd);
    return ret;
}
