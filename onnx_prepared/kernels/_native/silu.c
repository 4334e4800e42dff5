/* SiLU of the LLM MLP in one pass: y = (x * sigmoid(x)) [* u] over float32 rows (onnx_prepared::SiLU,
 * resolve/fusions_silu.py), in place of Sigmoid, Mul and the gate Mul.
 *
 * The bits are the unfused graph's: the Sigmoid is logistic.h's, which act.c's Sigmoid calls too (MLAS's
 * FMA3 logistic at every dispatch level), then the two products
 * each rounded once, as numpy's multiply rounds them (t = x * s, y = t * u). Each element is computed
 * alone, so neither the vector tail nor the split over threads changes a bit.
 *
 * x and u may be strided views (the gate and up halves of one MatMulNBits output, as Slice leaves them):
 * each is read as rows of contiguous floats with its own row stride; y is C-contiguous. One pass reads
 * x (and u) and writes y once: the unfused path copied the gate view for Sigmoid and wrote three
 * intermediates. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <string.h>

#include "logistic.h"
#include "pool.h"
#include "rnn_module.h" /* ext_isa_level */
#include "silu.h"

/* one row: y[i] = x[i] * sigmoid(x[i]) (* u[i] when u) */
typedef void silu_row_fn(const float *x, const float *u, float *y, size_t n);

static void silu_portable(const float *x, const float *u, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float t = x[i] * logistic1(x[i]);
        y[i] = u ? t * u[i] : t;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SILU_X86 1

__attribute__((target("avx2,fma"))) static inline __m256 silu8(__m256 x0)
{
    return _mm256_mul_ps(x0, logistic8(x0));
}

__attribute__((target("avx2,fma"))) static void silu_avx2(const float *x, const float *u, float *y, size_t n)
{
    size_t i = 0;
    if (u) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(u + i)));
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(x + i)));
    }
    if (i < n) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 t = silu8(_mm256_maskload_ps(x + i, m));
        if (u) t = _mm256_mul_ps(t, _mm256_maskload_ps(u + i, m));
        _mm256_maskstore_ps(y + i, m, t);
    }
}

__attribute__((target("avx512f"))) static inline __m512 silu16(__m512 x0)
{
    return _mm512_mul_ps(x0, logistic16(x0));
}

__attribute__((target("avx512f"))) static void silu_avx512(const float *x, const float *u, float *y, size_t n)
{
    size_t i = 0;
    if (u) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(x + i)), _mm512_loadu_ps(u + i)));
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, silu16(_mm512_loadu_ps(x + i)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 t = silu16(_mm512_maskz_loadu_ps(m, x + i));
        if (u) t = _mm512_mul_ps(t, _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(y + i, m, t);
    }
}
#endif

typedef struct {
    const char *x, *u; /* row r at x + r * xs (bytes) */
    float *y;          /* row r at y + r * cols */
    Py_ssize_t xs, us;
    size_t rows, cols, per; /* per: rows per task */
    silu_row_fn *fn;
} silu_job;

static void silu_rows(const silu_job *j, size_t r0, size_t r1)
{
    for (size_t r = r0; r < r1; r++)
        j->fn((const float *)(j->x + (Py_ssize_t)r * j->xs), j->u ? (const float *)(j->u + (Py_ssize_t)r * j->us) : NULL,
              j->y + r * j->cols, j->cols);
}

static void silu_task(void *ctx, int t)
{
    const silu_job *j = (const silu_job *)ctx;
    const size_t r0 = (size_t)t * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
    if (r0 < r1) silu_rows(j, r0, r1);
}

/* The float32 rows of a buffer: its shape collapsed to (rows, cols) with the last axis contiguous and one
 * byte stride between rows. 0 when it has that form, -1 (exception set) when not. */
static int as_rows(const Py_buffer *b, const char *what, size_t *rows, size_t *cols, Py_ssize_t *stride)
{
    const char *f = b->format ? b->format : "f";
    if (*f == '<' || *f == '=') f++;
    if (b->itemsize != 4 || strcmp(f, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "silu: %s must be float32", what);
        return -1;
    }
    const int nd = b->ndim;
    if (nd == 0) {
        *rows = 1, *cols = 1, *stride = 4;
        return 0;
    }
    *cols = (size_t)b->shape[nd - 1];
    size_t r = 1;
    for (int i = 0; i < nd - 1; i++) r *= (size_t)b->shape[i];
    *rows = r;
    if (r == 0 || *cols == 0) {
        *stride = 0;
        return 0;
    }
    if (*cols > 1 && b->strides[nd - 1] != 4) goto bad;
    /* the row stride: that of the innermost leading axis longer than 1; every outer one must step over
     * whole runs of it */
    Py_ssize_t s = (Py_ssize_t)(*cols * 4), step = 0, span = 1;
    int have = 0;
    for (int i = nd - 2; i >= 0; i--) {
        if (b->shape[i] == 1) continue;
        if (!have) {
            step = b->strides[i];
            have = 1;
        } else if (b->strides[i] != step * span) {
            goto bad;
        }
        span *= b->shape[i];
    }
    *stride = have ? step : s;
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "silu: %s is not rows of contiguous floats", what);
    return -1;
}

/* silu(x, u, y) -> True: y = x * sigmoid(x) (* u unless u is None), float32; x and u of one shape (rows
 * of contiguous floats, any row stride), y C-contiguous of x's size, not overlapping x or u */
PyObject *py_silu(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "silu(x, u, y)");
        return NULL;
    }
    const int has_u = args[1] != Py_None;
    Py_buffer bx, bu, by;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_STRIDED_RO | PyBUF_FORMAT) < 0) return NULL;
    if (has_u && PyObject_GetBuffer(args[1], &bu, PyBUF_STRIDED_RO | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&bx);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &by, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (has_u) PyBuffer_Release(&bu);
        PyBuffer_Release(&bx);
        return NULL;
    }
    PyObject *ret = NULL;
    silu_job j = {0};
    size_t ur = 0, uc = 0;
    if (as_rows(&bx, "x", &j.rows, &j.cols, &j.xs) < 0) goto done;
    if (has_u) {
        if (as_rows(&bu, "u", &ur, &uc, &j.us) < 0) goto done;
        if (ur != j.rows || uc != j.cols) {
            PyErr_SetString(PyExc_ValueError, "silu: x and u must have one shape");
            goto done;
        }
    }
    if (by.itemsize != 4 || !by.format || strchr(by.format, 'f') == NULL || (size_t)by.len != j.rows * j.cols * 4) {
        PyErr_SetString(PyExc_ValueError, "silu: y must be a float32 buffer of x's size");
        goto done;
    }
    j.x = (const char *)bx.buf;
    j.u = has_u ? (const char *)bu.buf : NULL;
    j.y = (float *)by.buf;
    j.fn = silu_portable;
#ifdef SILU_X86
    {
        const int level = ext_isa_level();
        j.fn = level >= 3 ? silu_avx512 : level >= 1 ? silu_avx2 : silu_portable;
    }
#endif
    if (j.rows && j.cols) {
        Py_BEGIN_ALLOW_THREADS
        /* ~16 Ki floats per task: large enough to amortize a pool hand-off, small enough to balance */
        const size_t chunk = (size_t)1 << 14, n = j.rows * j.cols;
        size_t nt = (n + chunk - 1) / chunk;
        if (nt > j.rows) nt = j.rows;
        if (nt <= 1) {
            silu_rows(&j, 0, j.rows);
        } else {
            j.per = (j.rows + nt - 1) / nt;
            nb_pool_run(silu_task, &j, (int)((j.rows + j.per - 1) / j.per));
        }
        Py_END_ALLOW_THREADS
    }
    ret = Py_True;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&by);
    if (has_u) PyBuffer_Release(&bu);
    PyBuffer_Release(&bx);
    return ret;
}
