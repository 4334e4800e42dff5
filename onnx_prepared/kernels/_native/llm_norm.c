/* RMS norm over the rows of a float32 matrix, optionally of x + skip (+ bias) (SimplifiedLayerNormalization,
 * SkipSimplifiedLayerNormalization, RMSNormalization), in the float32 operations and order onnxruntime's CPU
 * kernels use, so that the outputs are its bits (an int8-quantized MatMulNBits after the norm amplifies a
 * last-bit difference into a rounding flip): h = x (+ skip + bias), ms = sqrt(sum of h^2 / n + eps), the
 * sum h when asked. No contraction (ISO C mode). The rows are computed by llm_norm.inc, built per ISA
 * (llm_norm_isa.c: every level gives the same bits; wider vectors only make the elementwise loops faster);
 * large calls split over the pool by rows (a row's result does not depend on the split). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

#include "llm_norm.h"
#include "pool.h"
#include "rnn_module.h" /* ext_isa_level */


static void norm_task(void *ctx, int t)
{
    const norm_job *j = (const norm_job *)ctx;
    const long r0 = (long)t * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    if (!j->skip)
        for (long r = r0; r < r1; r++) j->plain(j, r);
    else
        for (long r = r0; r < r1; r += 8) j->skip_rows(j, r, r1 - r < 8 ? (int)(r1 - r) : 8);
}

static int view(PyObject *o, Py_buffer *v, int writable, Py_ssize_t need, const char *name)
{
    memset(v, 0, sizeof *v);
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len != need) {
        PyErr_Format(PyExc_ValueError, "rms_norm: %s holds %zd bytes, expected %zd", name, v->len, need);
        PyBuffer_Release(v);
        v->obj = NULL;
        return -1;
    }
    return 0;
}

/* rms_norm(x, skip|None, bias|None, gamma, y, sum|None, inv|None, rows, n, eps): float32, C-contiguous;
 * x, skip, y, sum [rows, n]; bias, gamma [n]; inv [rows]; skip, bias and sum only together (bias optional).
 * y and sum may not alias the inputs. */
PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "rms_norm takes 10 positional arguments");
        return NULL;
    }
    const long rows = PyLong_AsLong(args[7]), n = PyLong_AsLong(args[8]);
    const double eps = PyFloat_AsDouble(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (rows < 0 || n < 1 || rows > (1L << 40) / n) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: bad rows/n");
        return NULL;
    }
    const Py_ssize_t mat = 4 * (Py_ssize_t)rows * n;
    Py_buffer b[7];
    const char *names[7] = {"x", "skip", "bias", "gamma", "y", "sum", "inv"};
    const Py_ssize_t need[7] = {mat, mat, 4 * n, 4 * n, mat, mat, 4 * rows};
    PyObject *ret = NULL;
    int got = 0;
    for (; got < 7; got++)
        if (view(args[got], &b[got], got >= 4, need[got], names[got]) < 0) goto done;
    if (!b[0].obj || !b[3].obj || !b[4].obj || !b[1].obj != !b[5].obj || (b[2].obj && !b[1].obj)) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: x, gamma and y are required; skip and sum go together");
        goto done;
    }
    norm_job j = {(const float *)b[0].buf, (const float *)b[1].buf, (const float *)b[2].buf, (const float *)b[3].buf,
                  (float *)b[4].buf, (float *)b[5].buf, (float *)b[6].buf, rows, n, rows, (float)eps,
                  norm_plain_row_portable, norm_skip_rows_portable};
    const int level = ext_isa_level();
    if (level >= 3)
        j.plain = norm_plain_row_avx512, j.skip_rows = norm_skip_rows_avx512;
    else if (level >= 1)
        j.plain = norm_plain_row_avx2, j.skip_rows = norm_skip_rows_avx2;
    /* 16 Ki elements per task (8 rows of 2048): a hand-off costs about what such a block does, and small
     * tasks keep the caller busy when a worker is late (a shared machine) */
    const long per = (1L << 14) / n > 8 ? (1L << 14) / n / 8 * 8 : 8;
    const int ntasks = (int)((rows + per - 1) / per);
    j.rows_per_task = per;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1)
        nb_pool_run(norm_task, &j, ntasks);
    else
        norm_task(&j, 0);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    for (int i = 0; i < got; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return ret;
}
