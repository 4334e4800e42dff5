/* Conv's GEMM on weights prepacked once (sgemm.h's panel layout), over the extension's pool.
 *
 * y[b][g] = A[g] @ x[b][g] with A [M, K] from the packed panels, x [K, N] row-major; the epilogue adds
 * the bias and clips. The micro kernels are vectorised along the weight rows (M): each packed panel row
 * is loaded once per k and multiplied with broadcast columns of x, so a layer with few output positions
 * (late CNN layers: N = 4..50) streams its weights once instead of re-packing them per call as a
 * general sgemm does. Tasks are fixed blocks of (panels, columns) chosen from the shape only, so the
 * result does not depend on the thread count. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "pool.h"
#include "rnn_module.h"
#include "sgemm.h"

static void (*g_task)(const sg_job *, int) = sg_task_portable; /* set per call under the GIL */

static void sg_pool_task(void *ctx, int t) { g_task((const sg_job *)ctx, t); }

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

/* NOTE (threads): the AVX2 micro kernel runs at ~16 GMAC/s on one core of the 2-vCPU Zen 1 EPYC (its
 * 256-bit FMA is two 128-bit halves: that is the peak), so a late MobileNet layer's 1x1 Conv on 4x4
 * positions (960 x 160 x 16, 2.5M multiply-adds) is ~150 us of arithmetic, not of weight traffic. A
 * call is pooled from SG_POOL_MACS on (~16 us on one thread; a worker still polling joins within
 * 3-5 us) in tasks of about SG_TASK_MACS (~4 us), several per thread so that the pool's dynamic balance
 * absorbs a worker preempted by another process. */
enum { SG_POOL_MACS = 1 << 18, SG_TASK_MACS = 1 << 16 };

/* Blocks from the shape only, then the tasks (without the GIL); -1 with an exception set.
 * Columns: a block of x of at most ~96 KiB (K * columns floats, re-read from L2 by every panel pair),
 * a multiple of 12 (every level's micro tile divides it), or for the column-vectorised AVX-512 task
 * ~128 KiB in multiples of its 32-column tile (the AVX2 one: multiples of 16). Panels: split further until a task has about
 * SG_TASK_MACS multiply-adds (at most 64 tasks per (b, g)), in pairs (the AVX-512 tile is 2 panels). */
static int sg_run(sg_job *j, long B)
{
    const int level = ext_isa_level(), by_cols = level >= 3 && j->N >= SG_NCOLS_MIN && j->K <= SG_NCOLS_MAXK;
    const int by_cols2 = level >= 1 && level < 3 && j->N >= 16 && j->M <= SG_NCOLS2_MAXM;
    /* the column-vectorised task's tiles are 32 wide: blocks of whole tiles, up to ~128 KiB of x */
    const long align = by_cols ? 32 : by_cols2 ? 16 : SG_NCHUNK_ALIGN, budget = by_cols ? 32768 : 24576;
    long nch = budget / j->K / align * align;
    if (nch < align) nch = align;
    if (nch >= j->N) nch = ceil_div(j->N, align) * align;
    j->nchunk = nch;
    j->nnc = ceil_div(j->N, nch);
    const double work = (double)j->M * (double)j->K * (double)j->N;
    long want = (long)(work / (double)SG_TASK_MACS);
    if (want > 64) want = 64;
    long nmc = ceil_div(want > 1 ? want : 1, j->nnc);
    const long pairs = ceil_div(j->P, 2);
    if (nmc > pairs) nmc = pairs;
    j->mchunk = 2 * ceil_div(pairs, nmc);
    j->nmc = ceil_div(j->P, j->mchunk);
    const long ntasks = B * j->G * j->nmc * j->nnc;
    if (ntasks > (1L << 30)) {
        PyErr_SetString(PyExc_ValueError, "sgemm: too many tasks");
        return -1;
    }
    g_task = by_cols ? sg_ntask_avx512 : by_cols2 ? sg_ntask_avx2 : level >= 3 ? sg_task_avx512 : level >= 1 ? sg_task_avx2 : sg_task_portable;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1 && nb_pool_get_threads() > 1 && work * (double)B * (double)j->G >= (double)SG_POOL_MACS)
        nb_pool_run(sg_pool_task, j, (int)ntasks);
    else
        for (long t = 0; t < ntasks; t++) sg_pool_task(j, (int)t);
    Py_END_ALLOW_THREADS
    return 0;
}

/* sgemm_packed(a, x, y, bias|None, dims int64[5] = G M K N B, lo, hi, act[, alpha]) */
PyObject *py_sgemm_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "sgemm_packed takes 8 or 9 positional arguments");
        return NULL;
    }
    const double lo = PyFloat_AsDouble(args[5]), hi = PyFloat_AsDouble(args[6]);
    const long act = PyLong_AsLong(args[7]);
    const double alpha = nargs > 8 ? PyFloat_AsDouble(args[8]) : 0.0;
    if (PyErr_Occurred()) return NULL;
    if (act < 0 || act > SG_ACT_MAX) {
        PyErr_SetString(PyExc_ValueError, "sgemm_packed: act is 0, 1 or 2");
        return NULL;
    }
    Py_buffer bd, ba, bx, by, bb;
    memset(&bb, 0, sizeof bb);
    if (PyObject_GetBuffer(args[4], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_a = 0, have_x = 0, have_y = 0;
    if (bd.len < 5 * 8) {
        PyErr_SetString(PyExc_ValueError, "sgemm_packed: dims needs 5 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    for (int i = 0; i < 5; i++)
        if (d[i] < 1 || d[i] > (1LL << 31) - 1) {
            PyErr_SetString(PyExc_ValueError, "sgemm_packed: bad G, M, K, N or B");
            goto done;
        }
    sg_job j;
    memset(&j, 0, sizeof j);
    j.G = (long)d[0];
    j.M = (long)d[1];
    j.K = (long)d[2];
    j.N = (long)d[3];
    j.lo = (float)lo;
    j.hi = (float)hi;
    j.act = (int)act;
    j.alpha = (float)alpha;
    const long B = (long)d[4];
    j.P = ceil_div(j.M, SG_PANEL);
    if (PyObject_GetBuffer(args[0], &ba, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_a = 1;
    if (PyObject_GetBuffer(args[1], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[2], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    if (args[3] != Py_None && PyObject_GetBuffer(args[3], &bb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (ba.len < 4 * (Py_ssize_t)j.G * j.P * j.K * SG_PANEL || bx.len < 4 * (Py_ssize_t)B * j.G * j.K * j.N ||
        by.len < 4 * (Py_ssize_t)B * j.G * j.M * j.N || (bb.obj && bb.len < 4 * (Py_ssize_t)j.G * j.M)) {
        PyErr_SetString(PyExc_ValueError, "sgemm_packed: a buffer is smaller than its shape");
        goto done;
    }
    j.a = (const float *)ba.buf;
    j.x = (const float *)bx.buf;
    j.y = (float *)by.buf;
    j.bias = bb.obj ? (const float *)bb.buf : NULL;
    if (sg_run(&j, B) < 0) goto done;
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (bb.obj) PyBuffer_Release(&bb);
    if (have_y) PyBuffer_Release(&by);
    if (have_x) PyBuffer_Release(&bx);
    if (have_a) PyBuffer_Release(&ba);
    PyBuffer_Release(&bd);
    return ret;
}

