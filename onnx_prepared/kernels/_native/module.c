/* onnx_prepared.kernels._native._ext: the CPython entry points (METH_FASTCALL + buffer protocol),
 * the CPU dispatch (CPUID + XGETBV, chosen once at import; set_isa may lower it) and the work split
 * over the pool. Compute runs with the GIL released and allocates nothing: the caller passes the
 * output and the scratch buffers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "nbits.h"
#include "pool.h"
#include "rnn_module.h"
#include "prep_panels.h"
#include "conv_gemm.h"
#include "depthwise.h"
#include "sgemm.h"
#include "im2col.h"
#include "gap.h"
#include "act.h"
#include "nms.h"
#include "attention.h"
#include "llm_norm.h"
#include "llm_gather.h"
#include "winpool.h"
#include "se_block.h"
#include "qgemm.h"
#include "qlinear.h"
#include "encoder_act.h"
#include "resize.h"
#include "silu.h"

#ifdef NB_X86
#include <cpuid.h>
static const nb_isa *const LEVELS[] = {&nb_isa_portable, &nb_isa_avx2, &nb_isa_avx2vnni, &nb_isa_avx512vnni};
#else
static const nb_isa *const LEVELS[] = {&nb_isa_portable};
#endif
#define NLEVELS ((int)(sizeof(LEVELS) / sizeof(LEVELS[0])))

static int g_max_level = 0;
static const nb_isa *g_isa = &nb_isa_portable;

#ifdef NB_X86
static unsigned long long xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static int detect_level(void)
{
#ifdef NB_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx || !fma) return 0;
    const unsigned long long xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return 0; /* the OS saves XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub = a;
    const int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni512 = (c >> 11) & 1;
    int avxvnni = 0;
    if (max_sub >= 1) {
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        avxvnni = (a1 >> 4) & 1;
    }
    if (!avx2) return 0;
    /* opmask, upper halves of ZMM0-15 and ZMM16-31 (XCR0 bits 5-7) */
    if (f && dq && bw && vl && vnni512 && (xcr0 & 0xE6) == 0xE6) return 3;
    return avxvnni ? 2 : 1;
#else
    return 0;
#endif
}

/* ---- the call ---- */

typedef struct {
    nb_call c;
    int rc, nrc, pc, npc; /* rows per task, row chunks, panels per task, panel chunks */
    const nb_isa *isa;
} job;

static void prep_task(void *ctx, int t)
{
    job *j = (job *)ctx;
    const int m0 = t * j->rc, m1 = m0 + j->rc < j->c.M ? m0 + j->rc : j->c.M;
    j->isa->prep(&j->c, m0, m1);
}

static void gemm_task(void *ctx, int t)
{
    job *j = (job *)ctx;
    const int ri = t / j->npc, pi = t % j->npc;
    const int m0 = ri * j->rc, m1 = m0 + j->rc < j->c.M ? m0 + j->rc : j->c.M;
    const int p0 = pi * j->pc, p1 = p0 + j->pc < j->c.w.P ? p0 + j->pc : j->c.w.P;
    j->isa->gemm(&j->c, m0, m1, p0, p1);
}

static int get_buf(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    if (PyObject_GetBuffer(o, v, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (v->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, needs %zd", name, v->len, need);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static long arg_long(PyObject *o, int *ok)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) *ok = 0;
    return v;
}

/* matmul_q4(a, w, y, bias_or_None, scratch, M, K, N, block_size, zp_kind, mode) -> None */
static PyObject *py_matmul_q4(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "matmul_q4 takes 11 positional arguments");
        return NULL;
    }
    int ok = 1;
    const long M = arg_long(args[5], &ok), K = arg_long(args[6], &ok), N = arg_long(args[7], &ok);
    const long bs = arg_long(args[8], &ok), zk = arg_long(args[9], &ok), mode = arg_long(args[10], &ok);
    if (!ok) return NULL;
    if (M < 0 || K <= 0 || N <= 0 || bs < 16 || bs > 256 || (bs & (bs - 1)) || zk < 0 || zk > 2 || mode < 0 ||
        mode > NB_MODE_I8_FAST || (mode != NB_MODE_F32 && zk == NB_ZP_F32) || M > (1L << 30) || K > (1L << 30) || N > (1L << 30)) {
        PyErr_SetString(PyExc_ValueError, "matmul_q4: bad shape, block size, zero-point kind or mode");
        return NULL;
    }
    job j;
    memset(&j, 0, sizeof j);
    nb_weights *w = &j.c.w;
    w->K = (int)K;
    w->N = (int)N;
    w->bs = (int)bs;
    w->kb = (int)((K + bs - 1) / bs);
    w->kc = w->kb * (int)bs / 8;
    w->P = (int)((N + 15) / 16);
    w->zp_kind = (int)zk;
    const Py_ssize_t qw_bytes = (Py_ssize_t)w->P * w->kc * 64, sc_bytes = (Py_ssize_t)w->P * w->kb * 64;
    const Py_ssize_t zp_bytes = zk == NB_ZP_U4 ? (Py_ssize_t)w->P * w->kb * 8 : zk == NB_ZP_F32 ? sc_bytes : 0;
    Py_buffer ba, bw, by, bb, bsr;
    int have_bias = args[3] != Py_None;
    if (get_buf(args[0], &ba, 0, (Py_ssize_t)M * K * 4, "a") < 0) return NULL;
    if (get_buf(args[1], &bw, 0, qw_bytes + sc_bytes + zp_bytes, "packed weights") < 0) goto fail_a;
    if (get_buf(args[2], &by, 1, (Py_ssize_t)M * N * 4, "y") < 0) goto fail_w;
    if (have_bias && get_buf(args[3], &bb, 0, (Py_ssize_t)N * 4, "bias") < 0) goto fail_y;
    if (get_buf(args[4], &bsr, 1, (Py_ssize_t)nb_scratch_bytes((int)M, (int)K, (int)bs, (int)mode), "scratch") < 0)
        goto fail_b;
    const uint8_t *wb = (const uint8_t *)bw.buf;
    w->qw = wb;
    w->sc = (const float *)(wb + qw_bytes);
    w->zpn = zk == NB_ZP_U4 ? wb + qw_bytes + sc_bytes : NULL;
    w->zpf = zk == NB_ZP_F32 ? (const float *)(wb + qw_bytes + sc_bytes) : NULL;
    j.c.M = (int)M;
    j.c.mode = (int)mode;
    j.c.kpad = w->kb * (int)bs;
    j.c.a = (const float *)ba.buf;
    j.c.y = (float *)by.buf;
    j.c.bias = have_bias ? (const float *)bb.buf : NULL;
    nb_layout_scratch(&j.c, bsr.buf);
    j.isa = g_isa;
    if (mode == NB_MODE_F32 && K == j.c.kpad && !(j.isa->f32_tiles_from && M >= j.isa->f32_tiles_from))
        j.c.af = (float *)ba.buf; /* no padding and no tiles: read A in place */
    if (M > 0) {
        Py_BEGIN_ALLOW_THREADS
        const int T = nb_pool_get_threads();
        const double work = (double)M * (double)K * (double)N;
        const int par = T > 1 && work >= (double)(1 << 18);
        /* phase 1: prepare A, split over the pool only when there is a lot of it (about 1-2 % of the call:
         * a small pooled job would only wake the workers late and make the pool's back-off judge them) */
        j.rc = M * K >= (1 << 20) && par ? (int)((M + 2 * T - 1) / (2 * T)) : (int)M;
        j.nrc = (int)((M + j.rc - 1) / j.rc);
        nb_pool_run(prep_task, &j, j.nrc);
        /* phase 2: row chunks (32 rows, or the ISA's i8_rows in NB_MODE_I8) x panel chunks */
        const int rmax = mode == NB_MODE_I8 && j.isa->i8_rows ? j.isa->i8_rows : 32;
        j.rc = M <= rmax ? (int)M : rmax;
        j.nrc = (int)((M + j.rc - 1) / j.rc);
        int target = par ? 4 * T : 1;
        int npc = target / j.nrc;
        if (npc < 1) npc = 1;
        if (npc > w->P) npc = w->P;
        j.pc = (w->P + npc - 1) / npc;
        j.npc = (w->P + j.pc - 1) / j.pc;
        if (par)
            nb_pool_run(gemm_task, &j, j.nrc * j.npc);
        else
            for (int t = 0; t < j.nrc * j.npc; t++) gemm_task(&j, t);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&bsr);
    if (have_bias) PyBuffer_Release(&bb);
    PyBuffer_Release(&by);
    PyBuffer_Release(&bw);
    PyBuffer_Release(&ba);
    Py_RETURN_NONE;
fail_b:
    if (have_bias) PyBuffer_Release(&bb);
fail_y:
    PyBuffer_Release(&by);
fail_w:
    PyBuffer_Release(&bw);
fail_a:
    PyBuffer_Release(&ba);
    return NULL;
}

static PyObject *py_scratch_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scratch_bytes(M, K, block_size, mode)");
        return NULL;
    }
    int ok = 1;
    long M = arg_long(args[0], &ok), K = arg_long(args[1], &ok), bs = arg_long(args[2], &ok);
    long mode = arg_long(args[3], &ok);
    if (!ok) return NULL;
    if (M < 0 || K <= 0 || bs < 16) {
        PyErr_SetString(PyExc_ValueError, "scratch_bytes: bad arguments");
        return NULL;
    }
    return PyLong_FromSize_t(nb_scratch_bytes((int)M, (int)K, (int)bs, (int)mode));
}

/* ---- read bandwidth probe (benchmarks): sum of uint64 words over the pool ---- */

typedef struct {
    const uint64_t *p;
    size_t n, per;
    uint64_t part[256];
} read_job;

static void read_task(void *ctx, int t)
{
    read_job *r = (read_job *)ctx;
    const size_t i0 = (size_t)t * r->per, i1 = i0 + r->per < r->n ? i0 + r->per : r->n;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = i0;
    for (; i + 4 <= i1; i += 4) {
        s0 += r->p[i];
        s1 += r->p[i + 1];
        s2 += r->p[i + 2];
        s3 += r->p[i + 3];
    }
    for (; i < i1; i++) s0 += r->p[i];
    r->part[t] = s0 + s1 + s2 + s3;
}

static PyObject *py_read_sum(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    read_job r;
    r.p = (const uint64_t *)b.buf;
    r.n = (size_t)b.len / 8;
    int T = nb_pool_get_threads(), nt = 8 * T > 256 ? 256 : 8 * T;
    r.per = (r.n + (size_t)nt - 1) / (size_t)nt;
    uint64_t s = 0;
    Py_BEGIN_ALLOW_THREADS
    nb_pool_run(read_task, &r, nt);
    for (int t = 0; t < nt; t++) s += r.part[t];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(s);
}

/* ---- dispatch and threads ---- */

int ext_isa_level(void)
{
    for (int i = 0; i < NLEVELS; i++)
        if (LEVELS[i] == g_isa) return i;
    return 0;
}

static PyObject *py_isa(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(g_isa->name);
}

static PyObject *py_levels(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *t = PyTuple_New(g_max_level + 1);
    if (!t) return NULL;
    for (int i = 0; i <= g_max_level; i++) PyTuple_SET_ITEM(t, i, PyUnicode_FromString(LEVELS[i]->name));
    return t;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i < NLEVELS; i++) {
        if (strcmp(LEVELS[i]->name, name) == 0) {
            if (i > g_max_level) {
                PyErr_Format(PyExc_ValueError, "dispatch level %s is not supported by this CPU (highest: %s)", name,
                             LEVELS[g_max_level]->name);
                return NULL;
            }
            g_isa = LEVELS[i];
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown dispatch level %s", name);
    return NULL;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 1024) {
        PyErr_SetString(PyExc_ValueError, "set_num_threads: n must be in 1..1024");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    nb_pool_set_threads((int)n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(nb_pool_get_threads());
}

static PyObject *py_set_spin_us(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    nb_pool_set_spin_us((int)(n > 100000 ? 100000 : n));
    Py_RETURN_NONE;
}

static PyObject *py_pool_stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    long long v[6];
    nb_pool_stats(v);
    return Py_BuildValue("(LLLLLL)", v[0], v[1], v[2], v[3], v[4], v[5]);
}

static PyObject *py_pool_diag(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    long long v[5];
    nb_pool_diag(v);
    return Py_BuildValue("(LLLLL)", v[0], v[1], v[2], v[3], v[4]);
}

static PyObject *py_pool_set_wait(PyObject *self, PyObject *args)
{
    (void)self;
    int spin, yield, steer;
    if (!PyArg_ParseTuple(args, "iii", &spin, &yield, &steer)) return NULL;
    int old[3];
    nb_pool_get_wait(old);
    nb_pool_set_wait(spin > 100000 ? 100000 : spin, yield > 100000 ? 100000 : yield, steer);
    return Py_BuildValue("(iii)", old[0], old[1], old[2]);
}

static PyObject *py_pool_probe(PyObject *self, PyObject *args)
{
    (void)self;
    double timeout;
    int asleep;
    if (!PyArg_ParseTuple(args, "dp", &timeout, &asleep)) return NULL;
    int v[3];
    Py_BEGIN_ALLOW_THREADS
    nb_pool_probe((long long)(timeout * 1e9), asleep, v);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Oii)", v[0] ? Py_True : Py_False, v[1], v[2]);
}

static PyObject *py_pool_stalls(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(nb_pool_stalls());
}

static PyMethodDef methods[] = {
    {"matmul_q4", (PyCFunction)(void (*)(void))py_matmul_q4, METH_FASTCALL, "MatMulNBits (4-bit) on panel16 weights"},
    {"scratch_bytes", (PyCFunction)(void (*)(void))py_scratch_bytes, METH_FASTCALL, "scratch bytes for matmul_q4"},
    {"read_sum", py_read_sum, METH_O, "sum of a buffer's uint64 words over the pool (bandwidth probe)"},
    {"isa", py_isa, METH_NOARGS, "the active dispatch level"},
    {"levels", py_levels, METH_NOARGS, "the dispatch levels this CPU supports, lowest first"},
    {"set_isa", py_set_isa, METH_O, "select a supported dispatch level"},
    {"set_num_threads", py_set_num_threads, METH_O, "threads per call (caller included)"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "threads per call"},
    {"set_spin_us", py_set_spin_us, METH_O, "how long idle workers spin before sleeping"},
    {"pool_stalls", py_pool_stalls, METH_NOARGS, "jobs a worker declined (woken on the caller's CPU)"},
    {"pool_stats", py_pool_stats, METH_NOARGS, "(pooled jobs, declined, worker joins, worker tasks, tasks, solo jobs)"},
    {"pool_diag", py_pool_diag, METH_NOARGS, "(worker wake-ups, their summed latency ns, found spinning, moved, late)"},
    {"pool_probe", py_pool_probe, METH_VARARGS,
     "test hook (timeout_s, asleep): (a worker joined a gated 2-task job, its mask in it, after)"},
    {"pool_set_wait", py_pool_set_wait, METH_VARARGS, "(spin_us, yield_us, steer): the idle workers' wait policy; returns the previous one"},
    /* cnn-native: recurrent ops (rnn_module.c) */
    RNN_METHODS
    CONV_GEMM_METHODS
    DEPTHWISE_METHODS
    SGEMM_METHODS
    IM2COL_METHODS
    GAP_METHODS
    QLINEAR_METHODS
    /* nbits-perf: elementwise activations of the LLM path (act.c) */
    ACT_METHODS
    NMS_METHODS
    ATTENTION_METHODS
    LLM_NORM_METHODS
    LLM_GATHER_METHODS
    PREP_PANELS_METHODS
    WINPOOL_METHODS
    SE_BLOCK_METHODS
    QGEMM_METHODS
    ENCODER_ACT_METHODS
    RESIZE_METHODS
    SILU_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ext", "onnx-prepared native kernels", -1, methods};

PyMODINIT_FUNC PyInit__ext(void)
{
    g_max_level = detect_level();
    g_isa = LEVELS[g_max_level];
    return PyModule_Create(&moddef);
}
