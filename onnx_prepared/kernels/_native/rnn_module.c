/* rnn_layer: the CPython entry point of the recurrence (rnn.h), registered in module.c's method table.
 * Arguments are checked against the buffers' sizes here; the layer runs without the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "rnn.h"
#include "rnn_module.h"

static int view(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    if (o == Py_None) {
        memset(v, 0, sizeof *v);
        return 0;
    }
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len < need) {
        PyErr_Format(PyExc_ValueError, "rnn_layer: %s holds %zd bytes, needs %zd", name, v->len, need);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static void release(Py_buffer *v)
{
    if (v->obj) PyBuffer_Release(v);
}

enum { LCFG_N = 16, LFCFG_N = 13, LAYER_NARGS = 16 };

/* rnn_layer(cfg int32[16], fcfg float32[13], x|None, wt|None, xw|None, bias|None, rt, init_h|None,
 *           init_c|None, lens|None, p|None, rbh|None, y|None, h, c|None, scratch)
 * The whole layer in one call: the input projection (xw given: computed by the caller, bias included;
 * else from x [S*B][I] and wt = W^T [I][nd*G*H] plus bias, here), initial states copied into h/c
 * [nd][B][H] (zeros without them), Y [S][nd][B][H] zero-filled when lens is given, then every
 * direction's recurrence (rnn_args per direction: rt [nd][H][G*H], p [nd][3H], rbh [nd][H]).
 * cfg: kind seq batch hidden input ndirs reverse_mask input_forget linear_before_reset has_clip
 *      act[d][3] for d < 2;  fcfg: alpha[d][3] beta[d][3] for d < 2, clip */
PyObject *py_rnn_layer(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != LAYER_NARGS) {
        PyErr_SetString(PyExc_TypeError, "rnn_layer takes 16 positional arguments");
        return NULL;
    }
    Py_buffer bv[LAYER_NARGS];
    memset(bv, 0, sizeof bv);
    PyObject *ret = NULL;
    if (view(args[0], &bv[0], 0, LCFG_N * 4, "cfg") < 0 || view(args[1], &bv[1], 0, LFCFG_N * 4, "fcfg") < 0)
        goto done;
    const int32_t *cfg = (const int32_t *)bv[0].buf;
    const float *fc = (const float *)bv[1].buf;
    const int kind = cfg[0], nd = cfg[5], mask = cfg[6], has_clip = cfg[9] != 0;
    const long S = cfg[1], B = cfg[2], H = cfg[3], I = cfg[4];
    const int G = kind == RNN_KIND_LSTM ? 4 : kind == RNN_KIND_GRU ? 3 : 1;
    const long GH = G * H, N = nd * GH;
    int bad = kind < 0 || kind > 2 || nd < 1 || nd > 2 || S < 0 || B < 1 || H < 1 || I < 1 || S > (1L << 24) ||
              B > (1L << 24) || H > (1L << 16) || I > (1L << 24) || (has_clip && !(fc[12] >= 0.0f));
    for (int i = 0; i < 3 * nd; i++) bad |= cfg[10 + i] < 0 || cfg[10 + i] >= RNN_NACT;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rnn_layer: bad kind, shape, directions, activation or clip");
        goto done;
    }
    const Py_ssize_t sb = (Py_ssize_t)S * B, st = 4 * (Py_ssize_t)nd * B * H;
    const int project = args[4] == Py_None;
    const Py_ssize_t xw_bytes = project ? ((4 * sb * N + 63) & ~(Py_ssize_t)63) : 0;
    const size_t rec_bytes = rnn_scratch_bytes((int)B, (int)H, G);
    if (view(args[2], &bv[2], 0, project ? 4 * sb * I : 0, "x") < 0 ||
        view(args[3], &bv[3], 0, project ? 4 * I * N : 0, "wt") < 0 ||
        view(args[4], &bv[4], 0, 4 * sb * N, "xw") < 0 || view(args[5], &bv[5], 0, 4 * N, "bias") < 0 ||
        view(args[6], &bv[6], 0, 4 * nd * H * GH, "rt") < 0 || view(args[7], &bv[7], 0, st, "initial_h") < 0 ||
        view(args[8], &bv[8], 0, st, "initial_c") < 0 || view(args[9], &bv[9], 0, 4 * B, "lens") < 0 ||
        view(args[10], &bv[10], 0, 4 * nd * 3 * H, "p") < 0 || view(args[11], &bv[11], 0, 4 * nd * H, "rbh") < 0 ||
        view(args[12], &bv[12], 1, 4 * sb * nd * H, "y") < 0 || view(args[13], &bv[13], 1, st, "h") < 0 ||
        view(args[14], &bv[14], 1, st, "c") < 0 ||
        view(args[15], &bv[15], 1, xw_bytes + (Py_ssize_t)rec_bytes, "scratch") < 0)
        goto done;
    if (!bv[13].buf || (kind == RNN_KIND_LSTM && !bv[14].buf) || (project && (!bv[2].buf || !bv[3].buf))) {
        PyErr_SetString(PyExc_ValueError, "rnn_layer: h (and c for LSTM), and x with wt without xw, are needed");
        goto done;
    }
    const int32_t *lens = (const int32_t *)bv[9].buf;
    if (lens)
        for (long b = 0; b < B; b++)
            if (lens[b] < 0 || lens[b] > S) {
                PyErr_Format(PyExc_ValueError, "rnn_layer: lens[%ld] = %d is outside [0, %ld]", b, lens[b], S);
                goto done;
            }
    float *scratch = (float *)bv[15].buf;
    const float *xw = project ? scratch : (const float *)bv[4].buf;
    float *h = (float *)bv[13].buf, *c = (float *)bv[14].buf, *y = (float *)bv[12].buf;
    rnn_args A[2];
    memset(A, 0, sizeof A);
    for (int d = 0; d < nd; d++) {
        rnn_args *a = &A[d];
        a->kind = kind;
        a->seq = (int)S;
        a->batch = (int)B;
        a->hidden = (int)H;
        a->gates = G;
        a->reverse = (mask >> d) & 1;
        a->input_forget = cfg[7] != 0;
        a->linear_before_reset = cfg[8] != 0;
        a->has_clip = has_clip;
        a->clip = fc[12];
        for (int i = 0; i < 3; i++) {
            a->act[i] = cfg[10 + 3 * d + i];
            a->alpha[i] = fc[6 * d + i];
            a->beta[i] = fc[6 * d + 3 + i];
        }
        a->xw = xw + d * GH;
        a->xw_stride = N;
        a->rt = (const float *)bv[6].buf + (size_t)d * H * GH;
        a->h = h + (size_t)d * B * H;
        a->c = kind == RNN_KIND_LSTM ? c + (size_t)d * B * H : NULL;
        a->y = y ? y + (size_t)d * B * H : NULL;
        a->y_tstride = (long)nd * B * H;
        a->lens = lens;
        a->p = kind == RNN_KIND_LSTM && bv[10].buf ? (const float *)bv[10].buf + (size_t)d * 3 * H : NULL;
        a->rbh = kind == RNN_KIND_GRU && bv[11].buf ? (const float *)bv[11].buf + (size_t)d * H : NULL;
        a->scratch = (float *)((char *)scratch + xw_bytes);
    }
    const int level = ext_isa_level();
    void (*run)(const rnn_args *) = level >= 3 ? rnn_run_avx512 : level >= 1 ? rnn_run_avx2 : rnn_run_portable;
    void (*proj)(float *, const float *, const float *, const float *, long, int, int) =
        level >= 3 ? rnn_project_avx512 : level >= 1 ? rnn_project_avx2 : rnn_project_portable;
    const float *ih = (const float *)bv[7].buf, *ic = (const float *)bv[8].buf;
    Py_BEGIN_ALLOW_THREADS
    if (ih) memcpy(h, ih, (size_t)st); else memset(h, 0, (size_t)st);
    if (kind == RNN_KIND_LSTM) {
        if (ic) memcpy(c, ic, (size_t)st); else memset(c, 0, (size_t)st);
    }
    if (y && lens) memset(y, 0, (size_t)(4 * sb * nd * H));
    if (sb) {
        if (project)
            proj(scratch, (const float *)bv[2].buf, (const float *)bv[3].buf, (const float *)bv[5].buf, sb, (int)I,
                 (int)N);
        for (int d = 0; d < nd; d++) run(&A[d]);
    } else if (lens) {
        /* no step: zero-length rows keep zeros, as the recurrence would leave them */
        memset(h, 0, (size_t)st);
        if (kind == RNN_KIND_LSTM) memset(c, 0, (size_t)st);
    }
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < LAYER_NARGS; i++) release(&bv[i]);
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
