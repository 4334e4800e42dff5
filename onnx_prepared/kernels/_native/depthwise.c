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

/* pool the channels-last path from this many multiply-adds and copied floats on (~8 us on one thread) */
enum { DW_CL_POOL_WORK = 1 << 17 };
/* pool the channel blocks from this many multiply-adds on: ~2^16 is 8-12 us on one Zen 4 thread, and a
 * worker that is polling takes a job within ~5 us (pool.c); MobileNetV3's early depthwise layers (64
 * channels 32x32 -> 16x16 3x3, 147K multiply-adds, 24 us) ran on the caller alone below 2^18 */
enum { DW_BLK_POOL_WORK = 1 << 16 };

/* The channels-last task's tap lists (depthwise.h: cl_*) in one allocation, or NULL when out of memory. */
static int *dw_cl_taps(dw_job *j)
{
    const long OHW = j->OH * j->OW, K = j->KH * j->KW;
    if ((double)OHW * (double)K > (double)(1 << 30)) return NULL;
    int *mem = (int *)malloc(((size_t)OHW + 1 + 2 * (size_t)OHW * (size_t)K + 2 * (size_t)K) * sizeof(int));
    if (!mem) return NULL;
    int *start = mem, *pos = start + OHW + 1, *tap = pos + OHW * K, *used = tap + OHW * K, *index = used + K;
    for (long k = 0; k < K; k++) index[k] = -1;
    long e = 0;
    for (long q = 0; q < OHW; q++) { /* which taps any output reads inside the input */
        const long oh = q / j->OW, ow = q % j->OW;
        for (long ki = 0; ki < j->KH; ki++) {
            const long ih = oh * j->sh - j->pt + ki * j->dh;
            if (ih < 0 || ih >= j->H) continue;
            for (long kj = 0; kj < j->KW; kj++) {
                const long iw = ow * j->sw - j->pl + kj * j->dw;
                if (iw >= 0 && iw < j->W) index[ki * j->KW + kj] = 0;
            }
        }
    }
    long nu = 0;
    for (long k = 0; k < K; k++)
        if (index[k] == 0) {
            used[nu] = (int)k;
            index[k] = (int)nu++;
        }
    for (long q = 0; q < OHW; q++) {
        const long oh = q / j->OW, ow = q % j->OW;
        start[q] = (int)e;
        for (long ki = 0; ki < j->KH; ki++) {
            const long ih = oh * j->sh - j->pt + ki * j->dh;
            if (ih < 0 || ih >= j->H) continue;
            for (long kj = 0; kj < j->KW; kj++) {
                const long iw = ow * j->sw - j->pl + kj * j->dw;
                if (iw < 0 || iw >= j->W) continue;
                pos[e] = (int)(ih * j->W + iw);
                tap[e++] = index[ki * j->KW + kj];
            }
        }
    }
    start[OHW] = (int)e;
    j->cl_start = start, j->cl_pos = pos, j->cl_tap = tap, j->cl_used = used, j->cl_nused = nu;
    return mem;
}


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
    int *taps = NULL;
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
    /* small planes (at most DW_CL_MAX_PLANE positions) of at least half a block of channels, or whose
     * padded block is mostly pads, take the channels-last task below, which runs only the taps inside the
     * input (AVX2, one thread, CPU time: 960 channels 4x4 under 5x5: 124 -> 67 us, dilated by 2 149 -> 29;
     * 672 at 4x4, 3x3: 48 -> 27; 240 8x8 -> 4x4 3x3 stride 2: 19 -> 14; 576 at 2x2, 5x5: 32 -> 13); the
     * rest of mult 1 runs in channel blocks (16 channels 8x8, 3x3: 3.8 against 6.1 us channels-last) */
    const int tiny = j.H * j.W <= DW_CL_MAX_PLANE &&
                     (j.C >= DW_CL_BLOCK / 2 ||
                      dw_padded_rows(&j) * ((j.OW - 1) * j.sw + (j.KW - 1) * j.dw + 1) > 4 * j.H * j.W);
    if (j.mult == 1 && !tiny && dw_blk_floats(&j, dw_blk_lanes(lv)) <= DW_BLK_MAX_FLOATS) { /* channel blocks */
        /* at AVX-512, a block whose 16-lane scratch passes DW_BLK_WIDE_FLOATS runs the 8-lane AVX2 task
         * (the same bits): Zen 5, one thread, 64 channels at 32x32, 3x3: 46 -> 36 us; 16 channels 32x32 ->
         * 16x16 (87 KB of scratch) stays at 16 lanes, 4.6 -> 3.9 us */
        const int lb = lv >= 3 && dw_blk_floats(&j, 16) > DW_BLK_WIDE_FLOATS ? 1 : lv;
        void (*blk)(const dw_job *, int) = lb >= 3 ? dw_blk_avx512 : lb >= 1 ? dw_blk_avx2 : dw_blk_portable;
        const long lanes = dw_blk_lanes(lb), ntasks = j.N * ((j.C + lanes - 1) / lanes);
        const double work = (double)j.N * (double)j.C * (double)(j.OH * j.OW) * (double)(j.KH * j.KW);
        g_planes = blk;
        Py_BEGIN_ALLOW_THREADS
        if (ntasks > 1 && nb_pool_get_threads() > 1 && work >= (double)DW_BLK_POOL_WORK)
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
        taps = dw_cl_taps(&j);
        if (!taps) {
            PyErr_NoMemory();
            goto done;
        }
        void (*cl)(const dw_job *, int) = lv >= 3 ? dw_cl_avx512 : lv >= 1 ? dw_cl_avx2 : dw_cl_portable;
        const long ntasks = j.N * ((j.C + DW_CL_BLOCK - 1) / DW_CL_BLOCK);
        /* the taps inside the input and the two transposes, per channel */
        const double work = (double)j.N * (double)j.C *
                            ((double)j.cl_start[j.OH * j.OW] + (double)(j.H * j.W + j.OH * j.OW) + (double)j.cl_nused);
        g_planes = cl;
        Py_BEGIN_ALLOW_THREADS
        if (ntasks > 1 && nb_pool_get_threads() > 1 && work >= (double)DW_CL_POOL_WORK)
            nb_pool_run(dw_task, &j, (int)ntasks);
        else
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
    free(taps);
    if (have_y) PyBuffer_Release(&by);
    if (bb.obj) PyBuffer_Release(&bb);
    if (have_w) PyBuffer_Release(&bw);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}
