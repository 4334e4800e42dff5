/* Batched GEMM for Conv (y[b][g] = a[g] @ x[b][g], row-major float32) over the extension's pool: each task
 * calls OpenBLAS's single-threaded cblas_sgemm on one block of output columns (or rows, when there are
 * more rows than columns). The blocks depend on the shape only, so the result is the same for any
 * thread count. The sgemm address comes from the OpenBLAS numpy loaded (kernels/_blas.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "conv_gemm.h"
#include "pool.h"

enum { ROW_MAJOR = 101, NO_TRANS = 111 };
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm32_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                           float *, int);

static void *g_sgemm = NULL;
static int g_ilp64 = 0;

typedef struct {
    const float *a, *x;
    float *y;
    long G, M, K, N, nchunk, chunk;
    int split_rows;
} gemm_job;

static void gemm_task(void *ctx, int t)
{
    const gemm_job *j = (const gemm_job *)ctx;
    const long ci = t % j->nchunk, bg = t / j->nchunk, g = bg % j->G;
    const long total = j->split_rows ? j->M : j->N;
    const long c0 = ci * j->chunk, c1 = c0 + j->chunk < total ? c0 + j->chunk : total;
    if (c0 >= c1) return;
    const float *a = j->a + (size_t)g * j->M * j->K, *x = j->x + (size_t)bg * j->K * j->N;
    float *y = j->y + (size_t)bg * j->M * j->N;
    long m = j->M, n = j->N;
    if (j->split_rows) {
        a += (size_t)c0 * j->K;
        y += (size_t)c0 * j->N;
        m = c1 - c0;
    } else {
        x += c0;
        y += c0;
        n = c1 - c0;
    }
    if (g_ilp64)
        ((sgemm64_fn)g_sgemm)(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, j->K, 1.0f, a, j->K, x, j->N, 0.0f, y, j->N);
    else
        ((sgemm32_fn)g_sgemm)(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)m, (int)n, (int)j->K, 1.0f, a, (int)j->K, x,
                              (int)j->N, 0.0f, y, (int)j->N);
}

PyObject *py_conv_gemm_set_blas(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "conv_gemm_set_blas(address, ilp64)");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    if (!p && PyErr_Occurred()) return NULL;
    const int ilp = PyObject_IsTrue(args[1]);
    if (ilp < 0) return NULL;
    g_sgemm = p;
    g_ilp64 = ilp;
    Py_RETURN_NONE;
}

/* conv_gemm(a, x, y, G, M, K, N, B): a [G][M][K], x [B][G][K][N], y [B][G][M][N] (all float32, C order) */
PyObject *py_conv_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "conv_gemm takes 8 positional arguments");
        return NULL;
    }
    long v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsLong(args[3 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
        if (v[i] < 1 || v[i] > (1L << 31) - 1) {
            PyErr_SetString(PyExc_ValueError, "conv_gemm: bad G, M, K, N or B");
            return NULL;
        }
    }
    if (!g_sgemm) {
        PyErr_SetString(PyExc_RuntimeError, "conv_gemm: no sgemm bound (conv_gemm_set_blas)");
        return NULL;
    }
    gemm_job j = {NULL, NULL, NULL, v[0], v[1], v[2], v[3], 1, 0, 0};
    const long B = v[4];
    Py_buffer ba, bx, by;
    if (PyObject_GetBuffer(args[0], &ba, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &bx, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&ba);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&bx);
        PyBuffer_Release(&ba);
        return NULL;
    }
    PyObject *ret = NULL;
    if (ba.len < 4 * (Py_ssize_t)j.G * j.M * j.K || bx.len < 4 * (Py_ssize_t)B * j.G * j.K * j.N ||
        by.len < 4 * (Py_ssize_t)B * j.G * j.M * j.N) {
        PyErr_SetString(PyExc_ValueError, "conv_gemm: a buffer is smaller than its shape");
        goto done;
    }
    j.a = (const float *)ba.buf;
    j.x = (const float *)bx.buf;
    j.y = (float *)by.buf;
    /* blocks from the shape only: about one per 2^22 multiply-adds, at most 4 per (b, g) (every block
     * packs the shared operand again), at least 64 wide */
    j.split_rows = j.M > j.N;
    const long total = j.split_rows ? j.M : j.N;
    const double work = (double)j.M * (double)j.K * (double)j.N;
    long nch = (long)(work / (double)(1 << 22));
    if (nch > 4) nch = 4;
    if (nch > total / 64) nch = total / 64;
    if (nch < 1) nch = 1;
    j.chunk = (total + nch - 1) / nch;
    j.chunk = (j.chunk + 15) / 16 * 16;
    j.nchunk = (total + j.chunk - 1) / j.chunk;
    const int ntasks = (int)(B * j.G * j.nchunk);
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1 && nb_pool_get_threads() > 1)
        nb_pool_run(gemm_task, &j, ntasks);
    else
        for (int t = 0; t < ntasks; t++) gemm_task(&j, t);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&by);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&ba);
    return ret;
}
