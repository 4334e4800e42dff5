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
#include "tl_scratch.h"
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


static void sgc_pool_task(void *ctx, int t) { sg_ctask_avx512((const sg_cjob *)ctx, t); }

/* NOTE (task sizes of conv_implicit): tasks of ~2 * SG_TASK_MACS (one output row of a panel pair: 1.5-3 us)
 * made ResNet-18's 2-thread Convs gain 1.2-1.5x over one thread, against onnxruntime's 1.8x. Tasks of up
 * to 32 * SG_TASK_MACS (several rows: a task's weights stay in L1 and its windows' rows overlap), with at
 * least 8 tasks per thread so that a preempted thread's share stays small: batch 2, 2 threads, one process
 * alternating the sizes, medians of 40 calls, three runs at load 3-4.5 (other sessions): the 7x7/2 stem
 * 161-187 -> 138-148 us, 64 -> 64 3x3 at 16x16 150-159 -> 139-147; 64 -> 128 3x3/2 and 128 -> 128 at 8x8
 * within the noise (80-110, 134-157 either way); one thread the same within 1 %. Each output's sum is the
 * same chain whatever its task, so the split (it follows the thread count) does not change the bits. */
enum { SG_CTASK_MACS = 32 * SG_TASK_MACS, SG_CTASKS = 8 };

/* conv_implicit's padded copies, per thread: one buffer per geometry (N*C, H, W, HP, WP, pt, pl), the
 * last SG_XPADS used (those of at most SG_XPAD_KEEP floats), so a model's Convs find their zeros from the
 * previous run and copy only the image. */
enum { SG_XPADS = 8, SG_XPAD_KEEP = 1 << 20 }; /* floats: at most 8 x 4 MiB kept per thread */
typedef struct {
    float *buf;
    size_t n; /* floats */
    long key[7];
    unsigned long used;
} sg_xpad;
static _Thread_local sg_xpad tl_xpad[SG_XPADS];
static _Thread_local unsigned long tl_xpad_clock;

static _Thread_local float *tl_xpad_big; /* a copy past SG_XPAD_KEEP floats: one buffer, zeros written each call */
static _Thread_local size_t tl_xpad_big_n;

static void xpads_free(void)
{
    long long held = (long long)tl_xpad_big_n;
    for (int i = 0; i < SG_XPADS; i++) {
        free(tl_xpad[i].buf);
        held += (long long)tl_xpad[i].n;
        tl_xpad[i].buf = NULL;
        tl_xpad[i].n = 0;
    }
    free(tl_xpad_big);
    tl_xpad_big = NULL;
    tl_xpad_big_n = 0;
    tl_bytes(-held * (long long)sizeof(float));
}

/* The buffer of this geometry (*fresh: its zeros are still to be written), or NULL when out of memory. */
static float *xpad_for(const long key[7], size_t n, int *fresh)
{
    if (n > SG_XPAD_KEEP) {
        *fresh = 1;
        if (n > tl_xpad_big_n) {
            float *p = (float *)malloc(n * sizeof(float));
            if (!p) return NULL;
            tl_at_exit(xpads_free);
            tl_bytes((long long)((n - tl_xpad_big_n) * sizeof(float)));
            free(tl_xpad_big);
            tl_xpad_big = p;
            tl_xpad_big_n = n;
        }
        return tl_xpad_big;
    }
    sg_xpad *lru = &tl_xpad[0];
    tl_xpad_clock++;
    for (int i = 0; i < SG_XPADS; i++) {
        sg_xpad *e = &tl_xpad[i];
        if (e->buf && !memcmp(e->key, key, sizeof e->key)) {
            e->used = tl_xpad_clock;
            *fresh = 0;
            return e->buf;
        }
        if (!e->buf || e->used < lru->used) lru = e;
        if (!e->buf) break;
    }
    float *p = (float *)malloc(n * sizeof(float));
    if (!p) return NULL;
    tl_at_exit(xpads_free);
    tl_bytes((long long)n * (long long)sizeof(float) - (long long)lru->n * (long long)sizeof(float));
    free(lru->buf);
    lru->buf = p;
    lru->n = n;
    memcpy(lru->key, key, sizeof lru->key);
    lru->used = tl_xpad_clock;
    *fresh = 1;
    return p;
}

/* conv_implicit(x, a, bias|None, y, dims int64[15] = N C H W M KH KW OH OW pt pl sh sw dh dw, lo, hi, act[,
 * alpha[, res]]) -> True, or False below the AVX-512 level (the caller runs im2col + sgemm_packed). With res
 * (float32 of y's shape; act 0) y = clip(conv + bias + res): the sum the unfused Conv and Add compute, then
 * the clip (a residual block's Add and Relu). One group;
 * column strides 1 or 2. The image is copied once into zeros [C][HP][WP] (HP, WP: the rows and columns
 * the windows read), then tasks of (image, panel pairs, output rows) run sg_ctask_avx512: fixed by the
 * shape, and each output's sum is the same chain whatever the task, so the bits do not depend on the
 * thread count. */
PyObject *py_conv_implicit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 8 || nargs > 10) {
        PyErr_SetString(PyExc_TypeError, "conv_implicit takes 8 to 10 positional arguments");
        return NULL;
    }
    if (ext_isa_level() < 3) Py_RETURN_FALSE;
    const double lo = PyFloat_AsDouble(args[5]), hi = PyFloat_AsDouble(args[6]);
    const long act = PyLong_AsLong(args[7]);
    const double alpha = nargs > 8 ? PyFloat_AsDouble(args[8]) : 0.0;
    if (PyErr_Occurred()) return NULL;
    const int with_res = nargs > 9 && args[9] != Py_None;
    if (act < 0 || act > SG_ACT_MAX || (with_res && act)) {
        PyErr_SetString(PyExc_ValueError, "conv_implicit: act is 0, 1 or 2 (0 with a residual)");
        return NULL;
    }
    Py_buffer bd;
    if (PyObject_GetBuffer(args[4], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (bd.len != 15 * 8) {
        PyBuffer_Release(&bd);
        PyErr_SetString(PyExc_ValueError, "conv_implicit: dims needs 15 int64 values");
        return NULL;
    }
    long long d[15];
    memcpy(d, bd.buf, sizeof d);
    PyBuffer_Release(&bd);
    for (int i = 0; i < 15; i++)
        if (d[i] < (i == 9 || i == 10 ? 0 : 1) || d[i] > (1LL << 24)) {
            PyErr_SetString(PyExc_ValueError, "conv_implicit: bad dims");
            return NULL;
        }
    const long N = (long)d[0], C = (long)d[1], H = (long)d[2], W = (long)d[3], M = (long)d[4], KH = (long)d[5];
    const long KW = (long)d[6], OH = (long)d[7], OW = (long)d[8], pt = (long)d[9], pl = (long)d[10];
    const long sh = (long)d[11], sw = (long)d[12], dh = (long)d[13], dw = (long)d[14];
    if (sw > 2) {
        PyErr_SetString(PyExc_ValueError, "conv_implicit: column stride 1 or 2");
        return NULL;
    }
    const long K = C * KH * KW, P = ceil_div(M, SG_PANEL);
    const long HP = (OH - 1) * sh + (KH - 1) * dh + 1, WP = (OW - 1) * sw + (KW - 1) * dw + 1;
    Py_buffer bx, ba, bb, by, br;
    memset(&bb, 0, sizeof bb);
    memset(&br, 0, sizeof br);
    int got = 0;
    PyObject *ret = NULL;
    long *off = NULL;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    got = 1;
    if (PyObject_GetBuffer(args[1], &ba, PyBUF_C_CONTIGUOUS) < 0) goto done;
    got = 2;
    if (PyObject_GetBuffer(args[3], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    got = 3;
    if (args[2] != Py_None && PyObject_GetBuffer(args[2], &bb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (with_res && PyObject_GetBuffer(args[9], &br, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (bx.len != 4 * (Py_ssize_t)N * C * H * W || ba.len != 4 * (Py_ssize_t)P * K * SG_PANEL ||
        by.len != 4 * (Py_ssize_t)N * M * OH * OW || (bb.obj && bb.len != 4 * (Py_ssize_t)M) ||
        (br.obj && br.len != by.len)) {
        PyErr_SetString(PyExc_ValueError, "conv_implicit: buffer sizes do not match dims");
        goto done;
    }
    const size_t img = (size_t)C * HP * WP, need = (size_t)N * img + 16;
    const long xkey[7] = {N * C, H, W, HP, WP, pt, pl};
    int fresh = 1;
    float *xpad = xpad_for(xkey, need, &fresh);
    if (!xpad) {
        PyErr_NoMemory();
        goto done;
    }
    off = (long *)malloc((size_t)K * sizeof(long));
    if (!off) {
        PyErr_NoMemory();
        goto done;
    }
    for (long c = 0; c < C; c++)
        for (long kh = 0; kh < KH; kh++)
            for (long kw = 0; kw < KW; kw++) off[(c * KH + kh) * KW + kw] = c * HP * WP + kh * dh * WP + kw * dw;
    sg_cjob j;
    memset(&j, 0, sizeof j);
    j.a = (const float *)ba.buf;
    j.xp = xpad;
    j.y = (float *)by.buf;
    j.bias = bb.obj ? (const float *)bb.buf : NULL;
    j.off = off;
    j.M = M, j.K = K, j.P = P, j.OH = OH, j.OW = OW, j.HP = HP, j.WP = WP, j.sh = sh, j.sw = sw;
    j.img_stride = (long)img;
    j.lo = (float)lo, j.hi = (float)hi, j.act = (int)act, j.alpha = (float)alpha;
    j.res = br.obj ? (const float *)br.buf : NULL;
    /* tasks: whole panel pairs, then blocks of output rows of up to SG_CTASK_MACS, fewer rows while the call
     * would have under SG_CTASKS tasks per thread, split evenly (see the NOTE on task sizes) */
    j.mchunk = 2;
    j.nmc = ceil_div(P, 2);
    const double row_macs = (double)OW * K * (M < 32 ? M : 32);
    long rpt = (long)((double)SG_CTASK_MACS / (row_macs > 1 ? row_macs : 1));
    rpt = rpt < 1 ? 1 : rpt > OH ? OH : rpt;
    const long min_tasks = (long)SG_CTASKS * nb_pool_get_threads();
    while (rpt > 1 && N * j.nmc * ceil_div(OH, rpt) < min_tasks) rpt--;
    j.nrb = ceil_div(OH, rpt);
    j.rows_per_task = ceil_div(OH, j.nrb);
    j.nrb = ceil_div(OH, j.rows_per_task);
    const long ntasks = N * j.nmc * j.nrb;
    const float *x = (const float *)bx.buf;
    const double work = (double)N * M * K * OH * OW;
    Py_BEGIN_ALLOW_THREADS
    sg_pad_avx512(x, xpad, N * C, H, W, HP, WP, pt, pl, fresh);
    if (ntasks > 1 && nb_pool_get_threads() > 1 && work >= (double)SG_POOL_MACS)
        nb_pool_run(sgc_pool_task, &j, (int)ntasks);
    else
        for (long t = 0; t < ntasks; t++) sgc_pool_task(&j, (int)t);
    Py_END_ALLOW_THREADS
    ret = Py_True;
    Py_INCREF(ret);
done:
    free(off);
    if (br.obj) PyBuffer_Release(&br);
    if (bb.obj) PyBuffer_Release(&bb);
    if (got >= 3) PyBuffer_Release(&by);
    if (got >= 2) PyBuffer_Release(&ba);
    PyBuffer_Release(&bx);
    return ret;
}
