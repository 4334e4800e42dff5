/* A squeeze-and-excitation block (kernels/squeeze_excite.py) in one call, float32:
 *   s = mean of each [n, c] plane of x;  h = relu(W1 s + b1);  g = clip(alpha (W2 h + b2) + beta, 0, 1);
 *   y[n, c, :] = x[n, c, :] * g[c]
 * with W1 [Cr, C] and W2 [C, Cr] given transposed (w1t [C, Cr], w2t [Cr, C], the prepacked layout of
 * kernels/squeeze_excite.py). The three phases (se_block.h: means, hidden, excite; built per ISA in
 * se_block_isa.c) are cut into items of fixed ranges; each element is computed by one item in a fixed
 * order, so the result is the same for any thread count and at every dispatch level.
 *
 * NOTE (threads): a late MobileNetV3 block (960 channels, Cr 240, 4x4) streams 1.8 MB of weights for
 * 0.46M multiply-adds: ~40 us on one core, so large blocks run on the pool. A phase needs the whole of
 * the previous one (h reads every mean, a gate every h), so one pool job runs them all: each pool task
 * is a runner that claims the next item from the job's own counter, items in phase order, and an item
 * first waits until the previous phase's items are done. Those items were all claimed before it, by
 * runners that are running them (claims are in order), so the wait always ends, whichever runners the
 * pool starts and in whatever order; a caller left alone runs every item in order. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "rnn_module.h"
#include "se_block.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SE_RELAX() _mm_pause()
#else
#define SE_RELAX() ((void)0)
#endif

/* pool a block from this many multiply-adds and copied floats on (~10 us on one thread) */
enum { SE_POOL_WORK = 1 << 17, SE_MEAN_ITEM = 8192, SE_EXCITE_ITEM = SE_BLOCK };

typedef struct {
    const se_job *j;
    const se_ops *ops;
    long cm, ncm;       /* means: channels per item, items per image */
    long nrh;           /* hidden: items per image (SE_BLOCK outputs each) */
    long nce;           /* excite: items per image (SE_EXCITE_ITEM channels each) */
    long end0, end1, total; /* item ranges of the phases: [0, end0) means, [end0, end1) hidden, then excite */
    atomic_long next;
    atomic_long done[2]; /* finished items of the means and of the hidden phase */
} se_run;

static void se_item(se_run *r, long it)
{
    const se_job *j = r->j;
    if (it < r->end0) {
        const long n = it / r->ncm, c0 = it % r->ncm * r->cm;
        r->ops->means(j, n, c0, c0 + r->cm < j->C ? c0 + r->cm : j->C);
    } else if (it < r->end1) {
        const long i = it - r->end0, n = i / r->nrh, r0 = i % r->nrh * SE_BLOCK;
        r->ops->hidden(j, n, r0, r0 + SE_BLOCK < j->R ? r0 + SE_BLOCK : j->R);
    } else {
        const long i = it - r->end1, n = i / r->nce, c0 = i % r->nce * SE_EXCITE_ITEM;
        r->ops->excite(j, n, c0, c0 + SE_EXCITE_ITEM < j->C ? c0 + SE_EXCITE_ITEM : j->C);
    }
}

static void se_runner(void *ctx, int task)
{
    (void)task;
    se_run *r = (se_run *)ctx;
    for (;;) {
        const long it = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
        if (it >= r->total) return;
        const int phase = it < r->end0 ? 0 : it < r->end1 ? 1 : 2;
        if (phase > 0) {
            const long need = phase == 1 ? r->end0 : r->end1 - r->end0;
            while (atomic_load_explicit(&r->done[phase - 1], memory_order_acquire) < need) SE_RELAX();
        }
        se_item(r, it);
        if (phase < 2) atomic_fetch_add_explicit(&r->done[phase], 1, memory_order_release);
    }
}

static const se_ops *const g_levels[3] = {&se_ops_portable, &se_ops_avx2, &se_ops_avx512};

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
    buf = (float *)malloc((size_t)N * (size_t)(C + R) * sizeof(float));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    se_job j = {(const float *)bx.buf, (const float *)bw1.buf, bb1.obj ? (const float *)bb1.buf : NULL,
                (const float *)bw2.buf, bb2.obj ? (const float *)bb2.buf : NULL, (float *)by.buf, buf,
                buf + (size_t)N * C, N, C, P, R, (float)alpha, (float)beta};
    const int level = ext_isa_level();
    se_run run;
    run.j = &j;
    run.ops = g_levels[level >= 3 ? 2 : level >= 1 ? 1 : 0];
    run.cm = P >= SE_MEAN_ITEM ? 1 : SE_MEAN_ITEM / P;
    run.ncm = (C + run.cm - 1) / run.cm;
    run.nrh = (R + SE_BLOCK - 1) / SE_BLOCK;
    run.nce = (C + SE_EXCITE_ITEM - 1) / SE_EXCITE_ITEM;
    run.end0 = N * run.ncm;
    run.end1 = run.end0 + N * run.nrh;
    run.total = run.end1 + N * run.nce;
    atomic_init(&run.next, 0);
    atomic_init(&run.done[0], 0);
    atomic_init(&run.done[1], 0);
    const int threads = nb_pool_get_threads();
    const double work = (double)N * (2.0 * (double)C * (double)R + 2.0 * (double)C * (double)P);
    Py_BEGIN_ALLOW_THREADS
    if (threads > 1 && work >= (double)SE_POOL_WORK)
        nb_pool_run(se_runner, &run, threads);
    else
        se_runner(&run, 0);
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
