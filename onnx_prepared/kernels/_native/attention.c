/* gqa: the CPython entry point of GroupQueryAttention (attention.h), registered in module.c's method
 * table. Every size, length and position is checked here against the buffers (a ValueError names the
 * problem; attention.py turns it into a KernelError); the tasks then run without the GIL, one per
 * (batch entry, KV head), over the pool when the call is large enough to pay for the hand-off. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "pool.h"
#include "rnn_module.h" /* ext_isa_level */

typedef struct {
    gqa_job *job;
    void (*task)(gqa_job *, int);
} gqa_call;

static void gqa_pool_task(void *ctx, int t)
{
    gqa_call *c = (gqa_call *)ctx;
    c->task(c->job, t);
}

enum { NBUF = 13, NINT = 16, NFLT = 2, NARGS = NBUF + NINT + NFLT };

/* Below this much work (multiply-adds plus floats of KV cache copied) a call runs on the calling thread
 * (a pool hand-off costs more). */
#define GQA_POOL_MIN_WORK (1L << 18)

/* The order onnxruntime's MLAS picks on this CPU (its platform.cpp): the AVX-512F sum-exp kernel where
 * the CPU and OS have AVX-512F, else the AVX2 (FMA3) one; GCC's check covers the OS's saved state. */
PyObject *py_gqa_cpu_order(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    return PyLong_FromLong(__builtin_cpu_supports("avx512f") ? 0 : 1);
#else
    return PyLong_FromLong(0);
#endif
}

static int get(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    if (o == Py_None) {
        memset(v, 0, sizeof *v);
        if (need > 0) {
            PyErr_Format(PyExc_ValueError, "%s is required", name);
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, needs %zd", name, v->len, need);
        PyBuffer_Release(v);
        v->obj = NULL;
        return -1;
    }
    return 0;
}

/* gqa(q, k|None, v|None, past_k|None, past_v|None, seqlens int32, cos|None, sin|None, pos int64|None,
 *     head_sink|None, present_k, present_v, out,
 *     B, S, nh, kvh, H, L_past, P, total, causal, window, interleaved, half, cos_rows, pos_mode, pos0,
 *     exp8, scale, softcap)
 * exp8: 1 = MLAS's AVX2 sum-exp order, 0 = its AVX-512F one (attention.py gqa_order).
 * k None: packed QKV in q. cos None: no rotary. pos_mode 0: position = past + j, 1: pos0 + j, 2: pos[b, j].
 * smooth softmax is a head_sink of zeros (the caller passes one). */
PyObject *py_gqa(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != NARGS) {
        PyErr_Format(PyExc_TypeError, "gqa takes %d positional arguments", NARGS);
        return NULL;
    }
    long iv[NINT];
    for (int i = 0; i < NINT; i++) {
        iv[i] = PyLong_AsLong(args[NBUF + i]);
        if (iv[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const double scale = PyFloat_AsDouble(args[NBUF + NINT]), softcap = PyFloat_AsDouble(args[NBUF + NINT + 1]);
    if (PyErr_Occurred()) return NULL;
    gqa_job J;
    memset(&J, 0, sizeof J);
    J.B = iv[0], J.S = iv[1], J.nh = iv[2], J.kvh = iv[3], J.H = iv[4], J.L_past = iv[5], J.P = iv[6];
    const long total = iv[7];
    J.causal = iv[8] != 0, J.window = iv[9], J.interleaved = iv[10] != 0, J.half = iv[11];
    const long cos_rows = iv[12];
    J.pos_mode = (int)iv[13], J.pos0 = iv[14];
    J.exp8 = iv[15] != 0;
    J.scale = (float)scale, J.softcap = (float)softcap;
    const long lim = 1L << 30;
    if (J.B < 1 || J.S < 1 || J.nh < 1 || J.kvh < 1 || J.nh % J.kvh || J.H < 1 || J.L_past < 0 || total < 1 ||
        J.P < total || J.P < J.L_past || J.B > lim || J.S > lim || J.nh > 65536 || J.H > 65536 || J.P > lim ||
        J.half < 0 || 2 * J.half > J.H || J.pos_mode < 0 || J.pos_mode > 2 || cos_rows < 0 || cos_rows > lim) {
        PyErr_SetString(PyExc_ValueError, "gqa: bad sizes");
        return NULL;
    }
    J.first = J.S == total;
    const int packed = args[1] == Py_None, rotary = args[6] != Py_None;
    const Py_ssize_t rows = (Py_ssize_t)J.B * J.S, f = 4;
    const Py_ssize_t qrow = packed ? (J.nh + 2 * J.kvh) * J.H : J.nh * J.H, kvrow = J.kvh * J.H;
    const Py_ssize_t past_need = J.L_past ? f * J.B * kvrow * J.L_past : 0, pres = f * J.B * kvrow * J.P;
    const Py_ssize_t rot_need = rotary ? f * cos_rows * J.half : 0;
    Py_buffer bv[NBUF];
    memset(bv, 0, sizeof bv);
    PyObject *ret = NULL;
    if (get(args[0], &bv[0], 0, f * rows * qrow, "query") < 0 ||
        (!packed && (get(args[1], &bv[1], 0, f * rows * kvrow, "key") < 0 ||
                     get(args[2], &bv[2], 0, f * rows * kvrow, "value") < 0)) ||
        get(args[3], &bv[3], 0, past_need, "past_key") < 0 || get(args[4], &bv[4], 0, past_need, "past_value") < 0 ||
        get(args[5], &bv[5], 0, 4 * J.B, "seqlens_k") < 0 || get(args[6], &bv[6], 0, rot_need, "cos_cache") < 0 ||
        get(args[7], &bv[7], 0, rot_need, "sin_cache") < 0 ||
        get(args[8], &bv[8], 0, J.pos_mode == 2 ? 8 * rows : 0, "position_ids") < 0 ||
        get(args[9], &bv[9], 0, args[9] == Py_None ? 0 : f * J.nh, "head_sink") < 0 ||
        get(args[10], &bv[10], 1, pres, "present_key") < 0 || get(args[11], &bv[11], 1, pres, "present_value") < 0 ||
        get(args[12], &bv[12], 1, f * rows * J.nh * J.H, "output") < 0)
        goto done;
    if (rotary && args[7] == Py_None) {
        PyErr_SetString(PyExc_ValueError, "sin_cache is required with cos_cache");
        goto done;
    }
    J.q = (const float *)bv[0].buf;
    J.k = packed ? J.q + J.nh * J.H : (const float *)bv[1].buf;
    J.v = packed ? J.q + (J.nh + J.kvh) * J.H : (const float *)bv[2].buf;
    J.q_stride = qrow, J.kv_stride = packed ? qrow : kvrow;
    J.past_k = (const float *)bv[3].buf, J.past_v = (const float *)bv[4].buf;
    J.seqlens = (const int32_t *)bv[5].buf;
    J.cos = rotary ? (const float *)bv[6].buf : NULL, J.sin = rotary ? (const float *)bv[7].buf : NULL;
    J.pos = (const int64_t *)bv[8].buf;
    J.head_sink = (const float *)bv[9].buf;
    J.present_k = (float *)bv[10].buf, J.present_v = (float *)bv[11].buf, J.out = (float *)bv[12].buf;
    long kmax_all = 0;
    for (long b = 0; b < J.B; b++) {
        const long t = (long)J.seqlens[b] + 1, past = J.first ? 0 : t - J.S;
        if (t < 1 || t > total || past < 0 || (!J.first && past > J.L_past)) {
            PyErr_Format(PyExc_ValueError,
                         "seqlens_k[%ld] = %d inconsistent with sequence length %ld, total %ld and a past of %ld "
                         "positions", b, J.seqlens[b], J.S, total, J.L_past);
            goto done;
        }
        kmax_all = t > kmax_all ? t : kmax_all;
        if (rotary)
            for (long j = 0; j < J.S; j++) {
                const long p = J.pos_mode == 2 ? (long)J.pos[b * J.S + j] : J.pos_mode == 1 ? J.pos0 + j : past + j;
                if (p < 0 || p >= cos_rows) {
                    PyErr_Format(PyExc_ValueError, "rotary position %ld is outside the cos/sin cache (%ld rows)", p,
                                 cos_rows);
                    goto done;
                }
            }
    }
    J.flash = total > 1 && J.softcap <= 0.0f && J.head_sink == NULL;
    {
        static long l2 = -2;
        if (l2 == -2) l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        J.kv_block = (long)((int)l2 / (int)(4 * 4 * 2 * J.H));
        if (J.kv_block < 1) J.kv_block = 1;
        J.q_block = J.kv_block < 2 * J.H ? J.kv_block : 2 * J.H;
    }
    const int level = ext_isa_level();
    gqa_call call = {&J, level >= 3 ? gqa_task_avx512 : level >= 1 ? gqa_task_avx2 : gqa_task_portable};
    const int ntasks = (int)(J.B * J.kvh);
    const double work = 2.0 * (double)J.B * J.nh * J.S * kmax_all * J.H + 2.0 * (double)J.B * J.kvh * J.P * J.H;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1 && work >= (double)GQA_POOL_MIN_WORK)
        nb_pool_run(gqa_pool_task, &call, ntasks);
    else
        for (int t = 0; t < ntasks; t++) call.task(&J, t);
    Py_END_ALLOW_THREADS
    if (J.failed) {
        PyErr_NoMemory();
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < NBUF; i++)
        if (bv[i].obj) PyBuffer_Release(&bv[i]);
    return ret;
}
