/* rnn_seq: the CPython entry point of the recurrence (rnn.h), registered in module.c's method table.
 * Arguments are checked against the buffers' sizes here; the recurrence runs without the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "rnn.h"
#include "rnn_module.h"

enum { CFG_N = 16, FCFG_N = 7 };

static int view(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    if (o == Py_None) {
        memset(v, 0, sizeof *v);
        return 0;
    }
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len < need) {
        PyErr_Format(PyExc_ValueError, "rnn_seq: %s holds %zd bytes, needs %zd", name, v->len, need);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static void release(Py_buffer *v)
{
    if (v->obj) PyBuffer_Release(v);
}

/* rnn_seq(cfg int32[16], fcfg float32[7], xw, rt, h, c|None, y|None, lens|None, p|None, rbh|None, scratch)
 * cfg: kind seq batch hidden reverse input_forget linear_before_reset act0 act1 act2 xw_off xw_stride
 *      state_off y_off y_tstride has_clip;  fcfg: alpha0..2 beta0..2 clip */
PyObject *py_rnn_seq(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "rnn_seq takes 11 positional arguments");
        return NULL;
    }
    Py_buffer bv[11];
    memset(bv, 0, sizeof bv);
    PyObject *ret = NULL;
    if (view(args[0], &bv[0], 0, CFG_N * 4, "cfg") < 0 || view(args[1], &bv[1], 0, FCFG_N * 4, "fcfg") < 0)
        goto done;
    const int32_t *cfg = (const int32_t *)bv[0].buf;
    const float *fc = (const float *)bv[1].buf;
    rnn_args A;
    memset(&A, 0, sizeof A);
    A.kind = cfg[0];
    A.seq = cfg[1];
    A.batch = cfg[2];
    A.hidden = cfg[3];
    A.reverse = cfg[4] != 0;
    A.input_forget = cfg[5] != 0;
    A.linear_before_reset = cfg[6] != 0;
    const long xw_off = cfg[10], state_off = cfg[12], y_off = cfg[13];
    A.xw_stride = cfg[11];
    A.y_tstride = cfg[14];
    A.has_clip = cfg[15] != 0;
    for (int i = 0; i < 3; i++) {
        A.act[i] = cfg[7 + i];
        A.alpha[i] = fc[i];
        A.beta[i] = fc[3 + i];
    }
    A.clip = fc[6];
    A.gates = A.kind == RNN_KIND_LSTM ? 4 : A.kind == RNN_KIND_GRU ? 3 : 1;
    const long H = A.hidden, B = A.batch, S = A.seq, GH = A.gates * H;
    int bad = A.kind < 0 || A.kind > 2 || S < 0 || B < 1 || H < 1 || xw_off < 0 || state_off < 0 || y_off < 0 ||
              A.xw_stride < xw_off + GH || S > (1L << 24) || B > (1L << 24) || H > (1L << 16) ||
              (A.has_clip && !(A.clip >= 0.0f));
    for (int i = 0; i < 3; i++) bad |= A.act[i] < 0 || A.act[i] >= RNN_NACT;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rnn_seq: bad kind, shape, offsets, activation or clip");
        goto done;
    }
    const Py_ssize_t sb = (Py_ssize_t)S * B;
    const Py_ssize_t xw_need = sb ? 4 * ((sb - 1) * A.xw_stride + xw_off + GH) : 0;
    const Py_ssize_t st_need = 4 * (state_off + B * H);
    const int want_y = args[6] != Py_None;
    if (want_y && (A.y_tstride < B * H)) {
        PyErr_SetString(PyExc_ValueError, "rnn_seq: y_tstride is smaller than one step of Y");
        goto done;
    }
    const Py_ssize_t y_need = S ? 4 * (y_off + (S - 1) * A.y_tstride + B * H) : 0;
    if (view(args[2], &bv[2], 0, xw_need, "xw") < 0 || view(args[3], &bv[3], 0, 4 * H * GH, "rt") < 0 ||
        view(args[4], &bv[4], 1, st_need, "h") < 0 || view(args[5], &bv[5], 1, st_need, "c") < 0 ||
        view(args[6], &bv[6], 1, y_need, "y") < 0 || view(args[7], &bv[7], 0, 4 * B, "lens") < 0 ||
        view(args[8], &bv[8], 0, 4 * 3 * H, "p") < 0 || view(args[9], &bv[9], 0, 4 * H, "rbh") < 0 ||
        view(args[10], &bv[10], 1, (Py_ssize_t)rnn_scratch_bytes((int)B, (int)H, A.gates), "scratch") < 0)
        goto done;
    if (A.kind == RNN_KIND_LSTM && !bv[5].buf) {
        PyErr_SetString(PyExc_ValueError, "rnn_seq: LSTM needs the cell state c");
        goto done;
    }
    A.lens = (const int32_t *)bv[7].buf;
    if (A.lens)
        for (long b = 0; b < B; b++)
            if (A.lens[b] < 0 || A.lens[b] > S) {
                PyErr_Format(PyExc_ValueError, "rnn_seq: lens[%ld] = %d is outside [0, %ld]", b, A.lens[b], S);
                goto done;
            }
    A.xw = (const float *)bv[2].buf + xw_off;
    A.rt = (const float *)bv[3].buf;
    A.h = (float *)bv[4].buf + state_off;
    A.c = bv[5].buf ? (float *)bv[5].buf + state_off : NULL;
    A.y = want_y ? (float *)bv[6].buf + y_off : NULL;
    A.p = A.kind == RNN_KIND_LSTM ? (const float *)bv[8].buf : NULL;
    A.rbh = A.kind == RNN_KIND_GRU ? (const float *)bv[9].buf : NULL;
    A.scratch = (float *)bv[10].buf;
    if (sb) {
        const int level = ext_isa_level();
        void (*run)(const rnn_args *) = level >= 3 ? rnn_run_avx512 : level >= 1 ? rnn_run_avx2 : rnn_run_portable;
        Py_BEGIN_ALLOW_THREADS
        run(&A);
        Py_END_ALLOW_THREADS
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < 11; i++) release(&bv[i]);
    return ret;
}

PyObject *py_rnn_scratch_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "rnn_scratch_bytes(batch, hidden, gates)");
        return NULL;
    }
    long v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = PyLong_AsLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
        if (v[i] < 1 || v[i] > (1L << 24)) {
            PyErr_SetString(PyExc_ValueError, "rnn_scratch_bytes: bad arguments");
            return NULL;
        }
    }
    return PyLong_FromSize_t(rnn_scratch_bytes((int)v[0], (int)v[1], (int)v[2]));
}
