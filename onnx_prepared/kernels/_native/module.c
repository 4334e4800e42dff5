/* onnx_prepared.kernels._native._ext: the CPython entry points (METH_FASTCALL + buffer protocol),
 * the CPU dispatch (CPUID + XGETBV, chosen once at import; set_isa may lower it) and the work split
 * over the pool. Compute runs with the GIL released and allocates nothing: the caller passes the
 * output and the scratch buffers. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdint.h>
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
#include "tl_scratch.h"

#ifdef NB_X86
#include <cpuid.h>
static const nb_isa *const LEVELS[] = {&nb_isa_portable, &nb_isa_avx2, &nb_isa_avx2vnni, &nb_isa_avx512vnni};
#else
static const nb_isa *const LEVELS[] = {&nb_isa_portable};
#endif
#define NLEVELS ((int)(sizeof(LEVELS) / sizeof(LEVELS[0])))

static int g_max_level = 0;
/* NOTE: the levels this CPU runs are not every level up to the highest: a CPU with AVX-512 VNNI may lack
 * AVX-VNNI (VEX; Zen 4 has none), so avx2vnni is supported only where CPUID says so (a forced avx2vnni
 * on such a CPU ran vpdpbusd {vex} and died of SIGILL). Bit i: LEVELS[i] runs here. */
static unsigned g_supported = 1;
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
    g_supported |= 2u | (avxvnni ? 4u : 0u);
    /* opmask, upper halves of ZMM0-15 and ZMM16-31 (XCR0 bits 5-7) */
    if (f && dq && bw && vl && vnni512 && (xcr0 & 0xE6) == 0xE6) {
        g_supported |= 8u;
        return 3;
    }
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

/* A call's shapes and buffers (both entry points): a, y, bias (None or N floats) and the A scratch */
typedef struct {
    Py_buffer buf[4]; /* a, y, bias, scratch */
    int held[4];
} call_bufs;

static void release_bufs(call_bufs *v)
{
    for (int i = 0; i < 4; i++)
        if (v->held[i]) {
            PyBuffer_Release(&v->buf[i]);
            v->held[i] = 0;
        }
}

/* This thread's A scratch of a call given scratch=None: grown on demand, freed at thread exit (tl_scratch.h),
 * so a call builds no scratch array and asks no scratch_bytes (~0.2 us of an M=1 call's ~1.5 us in Python) */
static _Thread_local void *tl_call_scratch;
static _Thread_local size_t tl_call_scratch_n;

static void call_scratch_free(void)
{
    free(tl_call_scratch);
    tl_bytes(-(long long)tl_call_scratch_n);
    tl_call_scratch = NULL;
    tl_call_scratch_n = 0;
}

static void *call_scratch(size_t n)
{
    if (n > tl_call_scratch_n) {
        const size_t want = n < 4096 ? 4096 : n;
        void *p = malloc(want);
        if (!p) return NULL;
        tl_at_exit(call_scratch_free);
        tl_bytes((long long)want - (long long)tl_call_scratch_n);
        free(tl_call_scratch);
        tl_call_scratch = p;
        tl_call_scratch_n = want;
    }
    return tl_call_scratch;
}

/* Check (M, K, N, block size, zero-point kind, mode), bind a, y, bias and scratch (None: this thread's, see
 * call_scratch) and fill j except the weights' pointers; -1 with an exception set (nothing held) on error. */
static int bind_call(job *j, call_bufs *v, PyObject *a, PyObject *y, PyObject *bias, PyObject *scratch,
                     PyObject *const *dims)
{
    int ok = 1;
    const long M = arg_long(dims[0], &ok), K = arg_long(dims[1], &ok), N = arg_long(dims[2], &ok);
    const long bs = arg_long(dims[3], &ok), zk = arg_long(dims[4], &ok), mode = arg_long(dims[5], &ok);
    if (!ok) return -1;
    if (M < 0 || K <= 0 || N <= 0 || bs < 16 || bs > 256 || (bs & (bs - 1)) || zk < 0 || zk > 2 || mode < 0 ||
        mode > NB_MODE_I8_FAST || (mode != NB_MODE_F32 && zk == NB_ZP_F32) || M > (1L << 30) || K > (1L << 30) || N > (1L << 30)) {
        PyErr_SetString(PyExc_ValueError, "matmul_q4: bad shape, block size, zero-point kind or mode");
        return -1;
    }
    memset(j, 0, sizeof *j);
    memset(v, 0, sizeof *v);
    nb_weights *w = &j->c.w;
    w->K = (int)K;
    w->N = (int)N;
    w->bs = (int)bs;
    w->kb = (int)((K + bs - 1) / bs);
    w->kc = w->kb * (int)bs / 8;
    w->P = (int)((N + 15) / 16);
    w->zp_kind = (int)zk;
    const int have_bias = bias != Py_None;
    PyObject *objs[4] = {a, y, bias, scratch};
    const Py_ssize_t need[4] = {(Py_ssize_t)M * K * 4, (Py_ssize_t)M * N * 4, (Py_ssize_t)N * 4,
                                (Py_ssize_t)nb_scratch_bytes((int)M, (int)K, (int)bs, (int)mode)};
    static const char *const names[4] = {"a", "y", "bias", "scratch"};
    void *own = NULL;
    if (scratch == Py_None && !(own = call_scratch((size_t)need[3]))) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if ((i == 2 && !have_bias) || (i == 3 && own)) continue;
        if (get_buf(objs[i], &v->buf[i], i == 1 || i == 3, need[i], names[i]) < 0) {
            release_bufs(v);
            return -1;
        }
        v->held[i] = 1;
    }
    j->c.M = (int)M;
    j->c.mode = (int)mode;
    j->c.kpad = w->kb * (int)bs;
    j->c.a = (const float *)v->buf[0].buf;
    j->c.y = (float *)v->buf[1].buf;
    j->c.bias = have_bias ? (const float *)v->buf[2].buf : NULL;
    nb_layout_scratch(&j->c, own ? own : v->buf[3].buf);
    j->isa = g_isa;
    if (mode == NB_MODE_F32 && K == j->c.kpad && !(j->isa->f32_tiles_from && M >= j->isa->f32_tiles_from))
        j->c.af = (float *)v->buf[0].buf; /* no padding and no tiles: read A in place */
    return 0;
}

/* Bytes of the packed weights' sections for P panels (nbits.h) */
static void section_bytes(const nb_weights *w, int P, size_t out[3])
{
    out[0] = (size_t)P * w->kc * 64;
    out[1] = (size_t)P * w->kb * 64;
    out[2] = w->zp_kind == NB_ZP_U4 ? (size_t)P * w->kb * 8 : w->zp_kind == NB_ZP_F32 ? out[1] : 0;
}

/* Phase 1 of a call without the GIL: prepare A, split over the pool from PREP_POOL_FROM values of A (below
 * that it is a few microseconds, less than a hand-off). Returns whether phase 2 is worth the pool; sets
 * j->rc to phase 2's rows per task (32 rows, or the ISA's i8_rows in NB_MODE_I8).
 * NOTE: from 2^20 values before: a prefill of 128 tokens through the medium tiny-llm (K = 1024 and 2816)
 * quantized its A on the caller alone, 4.3-5.5 ms of a 155-255 ms forward (65 calls, traced per pool call,
 * load ~1.5-2.5). Pooled from 2^16 (M = 128, 2 threads, level 4, two settings interleaved in one process,
 * autogroup nice -19, load ~3, 10th percentiles of 120 calls): 1024x1024 721 -> 706 us, 1024x5632 3891 ->
 * 3858, 2816x1024 1785 -> 1770. Each row is quantized alone, so the split does not change a bit. */
#define PREP_POOL_FROM (1L << 16)
static int g_f32_digits = 1; /* NB_MODE_F32_DIGITS allowed (set_f32_digits: tests run both kernels) */

/* Whether an fp32 call runs as NB_MODE_F32_DIGITS (nbits.h): few rows, block 16 or 32, integer zero points;
 * then its phase 1 (inline: at most f32_digits_upto rows), and back to NB_MODE_F32 when A has a block the
 * digits cannot hold. */
static void try_digits(job *j)
{
    nb_call *c = &j->c;
    if (c->mode != NB_MODE_F32 || !g_f32_digits || c->M > j->isa->f32_digits_upto || !j->isa->digits_prep ||
        (c->w.bs != 16 && c->w.bs != 32) || c->w.zp_kind == NB_ZP_F32)
        return;
    c->mode = NB_MODE_F32_DIGITS;
    if (!j->isa->digits_prep(c, 0, c->M)) c->mode = NB_MODE_F32;
}

static int prepare_a(job *j)
{
    const long M = j->c.M;
    const int T = nb_pool_get_threads();
    const double work = (double)M * (double)j->c.w.K * (double)j->c.w.N;
    const int par = T > 1 && work >= (double)(1 << 18);
    j->rc = M * j->c.w.K >= PREP_POOL_FROM && par ? (int)((M + 2 * T - 1) / (2 * T)) : (int)M;
    j->nrc = (int)((M + j->rc - 1) / j->rc);
    try_digits(j);
    if (j->c.mode != NB_MODE_F32_DIGITS) nb_pool_run(prep_task, j, j->nrc);
    const int rmax = j->c.mode == NB_MODE_I8 && j->isa->i8_rows ? j->isa->i8_rows : 32;
    j->rc = M <= rmax ? (int)M : rmax;
    j->nrc = (int)((M + j->rc - 1) / j->rc);
    return par;
}

/* matmul_q4(a, w, y, bias_or_None, scratch_or_None, M, K, N, block_size, zp_kind, mode) -> None */
static PyObject *py_matmul_q4(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "matmul_q4 takes 11 positional arguments");
        return NULL;
    }
    job j;
    call_bufs v;
    if (bind_call(&j, &v, args[0], args[2], args[3], args[4], args + 5) < 0) return NULL;
    nb_weights *w = &j.c.w;
    size_t sz[3];
    section_bytes(w, w->P, sz);
    Py_buffer bw;
    if (get_buf(args[1], &bw, 0, (Py_ssize_t)(sz[0] + sz[1] + sz[2]), "packed weights") < 0) {
        release_bufs(&v);
        return NULL;
    }
    const uint8_t *wb = (const uint8_t *)bw.buf;
    w->qw = wb;
    w->sc = (const float *)(wb + sz[0]);
    w->zpn = w->zp_kind == NB_ZP_U4 ? wb + sz[0] + sz[1] : NULL;
    w->zpf = w->zp_kind == NB_ZP_F32 ? (const float *)(wb + sz[0] + sz[1]) : NULL;
    if (j.c.M > 0) {
        Py_BEGIN_ALLOW_THREADS
        const int par = prepare_a(&j);
        /* phase 2: row chunks x panel chunks */
        int target = par ? 4 * nb_pool_get_threads() : 1;
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
    PyBuffer_Release(&bw);
    release_bufs(&v);
    Py_RETURN_NONE;
}

/* ---- from the source arrays: each task packs a few panels into its thread's scratch, then multiplies them ---- */

typedef struct {
    job j;
    nb_src src;
    int ppt;             /* panels per task */
    _Atomic int failed;  /* a task's scratch could not be allocated */
} source_job;

/* Bytes of one task's packed panels in its thread's scratch: about this much stays in the core's L2 while
 * every row chunk reads it */
#define SOURCE_TASK_BYTES (192 << 10)

static void source_task(void *ctx, int t)
{
    source_job *s = (source_job *)ctx;
    const nb_weights *w = &s->j.c.w;
    const int p0 = t * s->ppt, p1 = p0 + s->ppt < w->P ? p0 + s->ppt : w->P;
    size_t sz[3];
    section_bytes(w, p1 - p0, sz);
    float *buf = nb_scratch((sz[0] + sz[1] + sz[2] + 64) / sizeof(float) + 1);
    if (!buf) {
        s->failed = 1;
        return;
    }
    uint8_t *qw = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63); /* 64-byte lines, as packed weights */
    nb_pack_panels(&s->src, p0, p1, qw, (float *)(qw + sz[0]), qw + sz[0] + sz[1]);
    /* the call on the whole N, its weights' pointers placed so that panels p0..p1-1 are these: the kernels
     * see the same N, panels and rows as matmul_q4's, hence its bits */
    nb_call c = s->j.c;
    size_t off[3];
    section_bytes(w, p0, off);
    c.w.qw = (const uint8_t *)((uintptr_t)qw - off[0]);
    c.w.sc = (const float *)((uintptr_t)(qw + sz[0]) - off[1]);
    c.w.zpn = w->zp_kind == NB_ZP_U4 ? (const uint8_t *)((uintptr_t)(qw + sz[0] + sz[1]) - off[2]) : NULL;
    c.w.zpf = w->zp_kind == NB_ZP_F32 ? (const float *)((uintptr_t)(qw + sz[0] + sz[1]) - off[2]) : NULL;
    for (int m0 = 0; m0 < c.M; m0 += s->j.rc) s->j.isa->gemm(&c, m0, m0 + s->j.rc < c.M ? m0 + s->j.rc : c.M, p0, p1);
}

/* matmul_q4_source(a, b, scales, zp_or_None, y, bias_or_None, scratch_or_None, M, K, N, block_size, zp_kind, mode)
 *   -> number of tasks: matmul_q4's result on the weights pack_q4 makes of (b, scales, zp), which are
 *   never packed whole (b uint8 [N][kb][bs/2], scales float [N][kb], zp uint8 [N][ceil(kb/2)] or float
 *   [N][kb], all C-contiguous) */
static PyObject *py_matmul_q4_source(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "matmul_q4_source takes 13 positional arguments");
        return NULL;
    }
    source_job s;
    call_bufs v;
    if (bind_call(&s.j, &v, args[0], args[4], args[5], args[6], args + 7) < 0) return NULL;
    const nb_weights *w = &s.j.c.w;
    const int zk = w->zp_kind, has_zp = args[3] != Py_None;
    if (has_zp != (zk != NB_ZP_NONE)) {
        release_bufs(&v);
        PyErr_SetString(PyExc_ValueError, "matmul_q4_source: zero points and zp_kind disagree");
        return NULL;
    }
    Py_buffer bb, bsc, bz;
    const Py_ssize_t zbytes = zk == NB_ZP_U4 ? (Py_ssize_t)w->N * ((w->kb + 1) / 2) : (Py_ssize_t)w->N * w->kb * 4;
    if (get_buf(args[1], &bb, 0, (Py_ssize_t)w->N * w->kc * 4, "b") < 0) goto fail_v;
    if (get_buf(args[2], &bsc, 0, (Py_ssize_t)w->N * w->kb * 4, "scales") < 0) goto fail_b;
    if (has_zp && get_buf(args[3], &bz, 0, zbytes, "zero points") < 0) goto fail_s;
    s.src.b = (const uint8_t *)bb.buf;
    s.src.sc = (const float *)bsc.buf;
    s.src.zpn = zk == NB_ZP_U4 ? (const uint8_t *)bz.buf : NULL;
    s.src.zpf = zk == NB_ZP_F32 ? (const float *)bz.buf : NULL;
    s.src.N = w->N;
    s.src.kb = w->kb;
    s.src.kc = w->kc;
    s.src.zp_kind = zk;
    s.failed = 0;
    size_t one[3];
    section_bytes(w, 1, one);
    const size_t panel = one[0] + one[1] + one[2];
    s.ppt = panel >= SOURCE_TASK_BYTES ? 1 : (int)(SOURCE_TASK_BYTES / panel);
    int ntasks = 0;
    if (s.j.c.M > 0) {
        Py_BEGIN_ALLOW_THREADS
        const int par = prepare_a(&s.j);
        /* at least 4 tasks per thread when there are panels enough (the pool balances them) */
        const int T = nb_pool_get_threads(), want = par ? 4 * T : 1;
        if (par && (w->P + s.ppt - 1) / s.ppt < want) s.ppt = (w->P + want - 1) / want;
        ntasks = (w->P + s.ppt - 1) / s.ppt;
        if (par)
            nb_pool_run(source_task, &s, ntasks);
        else
            for (int t = 0; t < ntasks; t++) source_task(&s, t);
        Py_END_ALLOW_THREADS
    }
    if (has_zp) PyBuffer_Release(&bz);
    PyBuffer_Release(&bsc);
    PyBuffer_Release(&bb);
    release_bufs(&v);
    if (s.failed) return PyErr_NoMemory();
    return PyLong_FromLong(ntasks);
fail_s:
    PyBuffer_Release(&bsc);
fail_b:
    PyBuffer_Release(&bb);
fail_v:
    release_bufs(&v);
    return NULL;
}

/* set_f32_digits(flag) -> the previous flag: whether fp32 calls of few rows may run by int8 digits */
static PyObject *py_set_f32_digits(PyObject *self, PyObject *arg)
{
    (void)self;
    const int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    const int old = g_f32_digits;
    g_f32_digits = on;
    return PyBool_FromLong(old);
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
    PyObject *t = PyList_New(0);
    if (!t) return NULL;
    for (int i = 0; i <= g_max_level; i++) {
        if (!(g_supported >> i & 1u)) continue;
        PyObject *name = PyUnicode_FromString(LEVELS[i]->name);
        if (!name || PyList_Append(t, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(t);
            return NULL;
        }
        Py_DECREF(name);
    }
    PyObject *tup = PyList_AsTuple(t);
    Py_DECREF(t);
    return tup;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i < NLEVELS; i++) {
        if (strcmp(LEVELS[i]->name, name) == 0) {
            if (i > g_max_level || !(g_supported >> i & 1u)) {
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
    {"matmul_q4_source", (PyCFunction)(void (*)(void))py_matmul_q4_source, METH_FASTCALL,
     "MatMulNBits (4-bit) from the source arrays, packed a few panels at a time per task"},
    {"scratch_bytes", (PyCFunction)(void (*)(void))py_scratch_bytes, METH_FASTCALL, "scratch bytes for matmul_q4"},
    {"read_sum", py_read_sum, METH_O, "sum of a buffer's uint64 words over the pool (bandwidth probe)"},
    {"isa", py_isa, METH_NOARGS, "the active dispatch level"},
    {"levels", py_levels, METH_NOARGS, "the dispatch levels this CPU supports, lowest first"},
    {"set_isa", py_set_isa, METH_O, "select a supported dispatch level"},
    {"set_f32_digits", py_set_f32_digits, METH_O, "allow fp32 MatMulNBits of few rows by int8 digits; the old flag"},
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
    TL_SCRATCH_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ext", "onnx-prepared native kernels", -1, methods};

PyMODINIT_FUNC PyInit__ext(void)
{
    g_max_level = detect_level();
    g_isa = LEVELS[g_max_level];
    return PyModule_Create(&moddef);
}
