/* 2-D depthwise Conv (one input channel per group, any channel multiplier), NCHW float32, over the pool.
 * Output channel c*mult + j reads input channel c with weight row w[c][j][KH*KW]. One channel per output
 * (mult 1) runs in blocks of channels, channels innermost in scratch (depthwise.inc: DW_BLK_ENTRY), tiny
 * mostly-padding planes channels last (DW_CL_ENTRY); otherwise each plane is padded into per-thread
 * scratch first (DW_ENTRY). Tasks are fixed blocks of output planes, so the
 * result does not depend on the thread count. The planes are computed by depthwise.inc, built for
 * portable, AVX2 and AVX-512 (depthwise_isa.c) and chosen by the dispatch level. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "depthwise.h"
#include "pool.h"
#include "rnn_module.h"

static void (*g_planes)(const dw_job *, int) = dw_planes_portable; /* set per call under the GIL */

static void dw_task(void *ctx, int t) { g_planes((const dw_job *)ctx, t); }


/* depthwise2d(x, w, b|None, y, dims int64[15], lo, hi, act[, alpha]): dims = N C H W mult KH KW OH OW pt pl sh
 * sw dh dw; the output is clipped to [lo, hi], then HardSwish'd when act is 1, LeakyRelu'd (slope alpha) when 2 */
PyObject *py_depthwise2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "depthwise2d takes 8 or 9 positional arguments");
        return NULL;
    }
    const double lo = PyFloat_AsDouble(args[5]), hi = PyFloat_AsDouble(args[6]);
    const long act = PyLong_AsLong(args[7]);
    const double alpha = nargs > 8 ? PyFloat_AsDouble(args[8]) : 0.0;
    if (PyErr_Occurred()) return NULL;
    if (act < 0 || act > 2) {
        PyErr_SetString(PyExc_ValueError, "depthwise2d: act is 0, 1 or 2");
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
                (long)d[13], (long)d[14], 1, NULL};
    int failed = 0;
    j.failed = &failed;
    j.lo = (float)lo;
    j.hi = (float)hi;
    j.act = (int)act;
    j.alpha = (float)alpha;
    int bad = 0;
    for (int i = 0; i < 15; i++) bad |= d[i] < (i == 9 || i == 10 ? 0 : 1) || d[i] > (1LL << 30);
    bad |= d[6] > DW_MAX_KW;
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
    const int lv = ext_isa_level();
    /* tiny planes whose padded block is mostly pads (2x2 under a 5x5 kernel: 36 positions for 4) stay with
     * the channels-last task below, which skips the pads (576 channels: 28 vs 39 us); the rest of mult 1
     * runs in channel blocks (72 channels 16x16 -> 8x8, 3x3 stride 2: 57 -> 42 us; 240 at 4x4, 5x5: 45 -> 38,
     * AVX2, one thread, load ~5) */
    const int tiny = j.H * j.W <= DW_CL_MAX_PLANE && dw_padded_rows(&j) * ((j.OW - 1) * j.sw + (j.KW - 1) * j.dw + 1) >
                                                      4 * j.H * j.W;
    if (j.mult == 1 && !tiny && dw_blk_floats(&j, dw_blk_lanes(lv)) <= DW_BLK_MAX_FLOATS) { /* channel blocks */
        void (*blk)(const dw_job *, int) = lv >= 3 ? dw_blk_avx512 : lv >= 1 ? dw_blk_avx2 : dw_blk_portable;
        const long lanes = dw_blk_lanes(lv), ntasks = j.N * ((j.C + lanes - 1) / lanes);
        const double work = (double)j.N * (double)j.C * (double)(j.OH * j.OW) * (double)(j.KH * j.KW);
        g_planes = blk;
        Py_BEGIN_ALLOW_THREADS
        /* as below: the pool from ~2^18 multiply-adds on */
        if (ntasks > 1 && nb_pool_get_threads() > 1 && work >= (double)(1 << 18))
            nb_pool_run(dw_task, &j, (int)ntasks);
        else
            for (long t = 0; t < ntasks; t++) blk(&j, (int)t);
        Py_END_ALLOW_THREADS
        if (failed) {
            PyErr_NoMemory();
            goto done;
        }
        ret = Py_None;
        Py_INCREF(ret);
        goto done;
    }
    if (j.mult == 1 && j.H * j.W <= DW_CL_MAX_PLANE) { /* small planes: channels last */
        void (*cl)(const dw_job *, int) = lv >= 3 ? dw_cl_avx512 : lv >= 1 ? dw_cl_avx2 : dw_cl_portable;
        const long ntasks = j.N * ((j.C + DW_CL_BLOCK - 1) / DW_CL_BLOCK);
        Py_BEGIN_ALLOW_THREADS
        for (long t = 0; t < ntasks; t++) cl(&j, (int)t);
        Py_END_ALLOW_THREADS
        if (failed) {
            PyErr_NoMemory();
            goto done;
        }
        ret = Py_None;
        Py_INCREF(ret);
        goto done;
    }
    const long total = j.N * M, per_plane = j.OH * j.OW * K;
    /* about 2^15 multiply-adds per task, fixed by the shape */
    j.planes_per_task = per_plane >= (1 << 15) ? 1 : (1 << 15) / (per_plane ? per_plane : 1);
    const int ntasks = (int)((total + j.planes_per_task - 1) / j.planes_per_task);
    const int level = lv;
    /* planes at most 8 wide run the 8-lane build at the AVX-512 level too (16 lanes: half of them wasted) */
    g_planes = level >= 3 && j.OW > 8 ? dw_planes_avx512 : level >= 1 ? dw_planes_avx2 : dw_planes_portable;
    Py_BEGIN_ALLOW_THREADS
    /* below ~2^18 multiply-adds per call (a few tens of microseconds) waking the pool costs more than
     * it saves */
    if (ntasks > 1 && nb_pool_get_threads() > 1 && (double)total * (double)per_plane >= (double)(1 << 18))
        nb_pool_run(dw_task, &j, ntasks);
    else
        for (int t = 0; t < ntasks; t++) dw_task(&j, t);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
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
