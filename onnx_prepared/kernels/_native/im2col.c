/* 2-D im2col for Conv's GEMM (sgemm.c reads the result in place), over the extension's pool.
 *
 * The column matrix of group g is [K = C/g * KH * KW][columns], k = (c, kh, kw); its columns are one
 * image's output positions (layout [nimg][G][K][OH*OW]) or, with merge, every image's side by side
 * ([G][K][nimg * OH*OW]: late layers have few positions per image). Each (image, channel, tap) row is
 * written as OH stretches of OW: zero where the tap falls in the padding, the input row otherwise (a
 * memcpy at stride 1). Tasks are fixed blocks of (image, channel) planes; the values do not depend on
 * the thread count (it is a copy). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "im2col.h"
#include "pool.h"

typedef struct {
    const float *x;
    float *cols;
    long nimg, C, H, W, G, KH, KW, OH, OW, pt, pl, sh, sw, dh, dw, merge, per_task;
} i2c_job;

static long ceil_div(long a, long b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

/* One (channel, tap) row at unit strides with the output as wide as the input (a "same" convolution):
 * output row oh is input row oh + dy shifted by off, so the rows inside the input are one copy of the
 * flattened plane (clipped to the plane; the elements it takes across row ends land in the columns
 * outside [lo, hi), zeroed after), then the padding rows and columns are zeroed. Instead of a memcpy
 * and up to two stores per output row (a 3x3 same conv over 16 channels at 8x8: 14 -> 5 us). */
static void i2c_rows_unit(const float *src, float *dst, long H, long W, long OH, long dy, long off, long lo,
                          long hi)
{
    long r0 = -dy > 0 ? -dy : 0, r1 = H - dy < OH ? H - dy : OH; /* output rows reading an input row */
    if (r1 < r0) r1 = r0;
    if (r0 > 0) memset(dst, 0, (size_t)(r0 * W) * sizeof(float));
    if (r1 < OH) memset(dst + r1 * W, 0, (size_t)((OH - r1) * W) * sizeof(float));
    if (r1 == r0) return;
    long q0 = r0 * W, q1 = r1 * W;                 /* output elements [q0, q1) */
    const long s0 = (r0 + dy) * W + off - q0;      /* input index = output index + s0 */
    if (q0 + s0 < 0) q0 = -s0;                     /* clip to the plane [0, H * W) */
    if (q1 + s0 > H * W) q1 = H * W - s0;
    if (q1 > q0) memcpy(dst + q0, src + q0 + s0, (size_t)(q1 - q0) * sizeof(float));
    for (long r = r0; r < r1; r++) {
        float *row = dst + r * W;
        for (long c = 0; c < lo; c++) row[c] = 0.0f;
        for (long c = hi; c < W; c++) row[c] = 0.0f;
    }
}

static void i2c_task(void *ctx, int t)
{
    const i2c_job *j = (const i2c_job *)ctx;
    const long total = j->nimg * j->C, p0 = (long)t * j->per_task;
    const long p1 = p0 + j->per_task < total ? p0 + j->per_task : total;
    const long cg = j->C / j->G, K = cg * j->KH * j->KW, P = j->OH * j->OW, OW = j->OW;
    for (long p = p0; p < p1; p++) {
        const long img = p / j->C, gc = p % j->C, g = gc / cg, c = gc % cg;
        const float *src = j->x + ((size_t)img * j->C + gc) * j->H * j->W;
        for (long kh = 0; kh < j->KH; kh++)
            for (long kw = 0; kw < j->KW; kw++) {
                const long k = (c * j->KH + kh) * j->KW + kw;
                float *dst = j->merge ? j->cols + (((size_t)g * K + k) * j->nimg + img) * P
                                      : j->cols + (((size_t)img * j->G + g) * K + k) * P;
                /* output columns whose input column iw = ow * sw + off is inside the row: [lo, hi) */
                const long off = kw * j->dw - j->pl;
                long lo = ceil_div(-off, j->sw), hi = ceil_div(j->W - off, j->sw);
                lo = lo < 0 ? 0 : lo > OW ? OW : lo;
                hi = hi < lo ? lo : hi > OW ? OW : hi;
                if (j->sh == 1 && j->sw == 1 && OW == j->W) {
                    i2c_rows_unit(src, dst, j->H, OW, j->OH, kh * j->dh - j->pt, off, lo, hi);
                    continue;
                }
                for (long oh = 0; oh < j->OH; oh++, dst += OW) {
                    const long ih = oh * j->sh - j->pt + kh * j->dh;
                    if (ih < 0 || ih >= j->H) {
                        memset(dst, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    const float *row = src + (size_t)ih * j->W + off;
                    for (long ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    if (j->sw == 1) {
                        if (hi > lo) memcpy(dst + lo, row + lo, (size_t)(hi - lo) * sizeof(float));
                    } else if (j->sw == 2) { /* a constant stride: GCC vectorises it (shuffles of two loads) */
                        for (long ow = lo; ow < hi; ow++) dst[ow] = row[2 * ow];
                    } else {
                        for (long ow = lo; ow < hi; ow++) dst[ow] = row[ow * j->sw];
                    }
                    for (long ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
                }
            }
    }
}

/* im2col2d(x, cols, dims int64[16] = nimg C H W G KH KW OH OW pt pl sh sw dh dw merge) */
PyObject *py_im2col2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "im2col2d takes 3 positional arguments");
        return NULL;
    }
    Py_buffer bd, bx, bc;
    if (PyObject_GetBuffer(args[2], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_c = 0;
    if (bd.len < 16 * 8) {
        PyErr_SetString(PyExc_ValueError, "im2col2d: dims needs 16 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    int bad = 0;
    for (int i = 0; i < 16; i++) bad |= d[i] < (i == 9 || i == 10 || i == 15 ? 0 : 1) || d[i] > (1LL << 30);
    if (!bad) bad = d[1] % d[4] != 0;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "im2col2d: bad dims");
        goto done;
    }
    i2c_job j = {NULL, NULL, (long)d[0], (long)d[1], (long)d[2], (long)d[3], (long)d[4], (long)d[5], (long)d[6],
                 (long)d[7], (long)d[8], (long)d[9], (long)d[10], (long)d[11], (long)d[12], (long)d[13],
                 (long)d[14], (long)d[15], 1};
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &bc, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_c = 1;
    const double taps = (double)j.KH * j.KW, planes = (double)j.nimg * j.C, P = (double)j.OH * j.OW;
    if (bx.len < 4 * planes * j.H * j.W || bc.len < 4 * planes * taps * P) {
        PyErr_SetString(PyExc_ValueError, "im2col2d: a buffer is smaller than its shape");
        goto done;
    }
    j.x = (const float *)bx.buf;
    j.cols = (float *)bc.buf;
    /* about 2^15 floats written per task, fixed by the shape */
    const double per_plane = taps * P;
    j.per_task = per_plane >= (1 << 15) ? 1 : (long)((1 << 15) / per_plane);
    const long total = j.nimg * j.C, ntasks = (total + j.per_task - 1) / j.per_task;
    Py_BEGIN_ALLOW_THREADS
    if (ntasks > 1 && nb_pool_get_threads() > 1 && planes * per_plane >= (double)(1 << 16))
        nb_pool_run(i2c_task, &j, (int)ntasks);
    else
        for (long t = 0; t < ntasks; t++) i2c_task(&j, (int)t);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_c) PyBuffer_Release(&bc);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}

/* ConvTranspose's col2im when every stride equals its kernel extent (no pads, dilations or output
 * padding: a UNet's 2x2/2 upsampling): the taps tile the output without overlap, so
 * y[b][m][i * KH + a][jj * KW + bb] = cols[b][m * KH * KW + a * KW + bb][i * W + jj] (+ bias[m]), one
 * pass (numpy: a uint64 interleave of column pairs, a transposing copy, then the bias: 86 -> ~20 us on
 * 16 x 8x8 -> 16x16). The same float32 add as the numpy path, so the same values. */
static void c2t_plane(const float *cols, float *y, long KH, long KW, long H, long W, const float *bias)
{
    const float v = bias ? *bias : 0.0f;
    const long OW = W * KW, P = H * W;
    for (long i = 0; i < H; i++)
        for (long a = 0; a < KH; a++) {
            float *dst = y + (i * KH + a) * OW;
            for (long bb = 0; bb < KW; bb++) {
                const float *src = cols + (a * KW + bb) * P + i * W;
                if (bias)
                    for (long jj = 0; jj < W; jj++) dst[jj * KW + bb] = src[jj] + v;
                else
                    for (long jj = 0; jj < W; jj++) dst[jj * KW + bb] = src[jj];
            }
        }
}

/* col2im_tiled(cols, bias|None, y, dims int64[6] = N M KH KW H W) */
PyObject *py_col2im_tiled(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "col2im_tiled takes 4 positional arguments");
        return NULL;
    }
    Py_buffer bd, bc, by, bb;
    memset(&bb, 0, sizeof bb);
    if (PyObject_GetBuffer(args[3], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_c = 0, have_y = 0;
    const long long *d = (const long long *)bd.buf;
    int bad = bd.len < 6 * 8;
    for (int i = 0; !bad && i < 6; i++) bad |= d[i] < 1 || d[i] > (1LL << 30);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "col2im_tiled: dims needs 6 positive int64 values");
        goto done;
    }
    const long N = (long)d[0], M = (long)d[1], KH = (long)d[2], KW = (long)d[3], H = (long)d[4], W = (long)d[5];
    if (PyObject_GetBuffer(args[0], &bc, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_c = 1;
    if (args[1] != Py_None && PyObject_GetBuffer(args[1], &bb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[2], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    const double total = (double)N * M * KH * KW * H * W;
    if (bc.len < 4 * total || by.len < 4 * total || (bb.obj && bb.len < 4 * (Py_ssize_t)M)) {
        PyErr_SetString(PyExc_ValueError, "col2im_tiled: a buffer is smaller than its shape");
        goto done;
    }
    const float *cols = (const float *)bc.buf, *bias = bb.obj ? (const float *)bb.buf : NULL;
    float *y = (float *)by.buf;
    const size_t plane = (size_t)KH * KW * H * W;
    Py_BEGIN_ALLOW_THREADS
    for (long p = 0; p < N * M; p++)
        c2t_plane(cols + p * plane, y + p * plane, KH, KW, H, W, bias ? bias + p % M : NULL);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_y) PyBuffer_Release(&by);
    if (bb.obj) PyBuffer_Release(&bb);
    if (have_c) PyBuffer_Release(&bc);
    PyBuffer_Release(&bd);
    return ret;
}

/* Nearest resizing by whole factors of the last two axes (Resize's repeat path, resize.py _repeats):
 * y[p][i * RH + a][j * RW + b] = x[p][i][j]. Each output row is built once and copied RH - 1 more
 * times (numpy: a uint64 interleave then a broadcasting copy, 30 us on 8x16x16 x2). A copy: the
 * values are the input's. */
/* nearest_repeat2d(x, y, dims int64[5] = P H W RH RW) */
PyObject *py_nearest_repeat2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "nearest_repeat2d takes 3 positional arguments");
        return NULL;
    }
    Py_buffer bd, bx, by;
    if (PyObject_GetBuffer(args[2], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_y = 0;
    const long long *d = (const long long *)bd.buf;
    int bad = bd.len < 5 * 8;
    for (int i = 0; !bad && i < 5; i++) bad |= d[i] < 1 || d[i] > (1LL << 30);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "nearest_repeat2d: dims needs 5 positive int64 values");
        goto done;
    }
    const long P = (long)d[0], H = (long)d[1], W = (long)d[2], RH = (long)d[3], RW = (long)d[4];
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    if (bx.len < 4 * (double)P * H * W || by.len < 4 * (double)P * H * W * RH * RW || bx.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "nearest_repeat2d: a buffer is smaller than its shape (4-byte items)");
        goto done;
    }
    const uint32_t *x = (const uint32_t *)bx.buf;
    uint32_t *y = (uint32_t *)by.buf;
    const long OW = W * RW;
    Py_BEGIN_ALLOW_THREADS
    for (long r = 0; r < P * H; r++) {
        const uint32_t *src = x + r * W;
        uint32_t *dst = y + r * RH * OW;
        if (RW == 2)
            for (long j = 0; j < W; j++) dst[2 * j] = dst[2 * j + 1] = src[j];
        else
            for (long j = 0; j < W; j++)
                for (long b = 0; b < RW; b++) dst[j * RW + b] = src[j];
        for (long a = 1; a < RH; a++) memcpy(dst + a * OW, dst, (size_t)OW * 4);
    }
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_y) PyBuffer_Release(&by);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}
