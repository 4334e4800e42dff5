/* Direct 2-D convolution at unit strides and dilations, on the prepacked SGEMM's weight panels
 * (sgemm.h's layout), without the im2col matrix.
 *
 * im2col writes C/g * KH * KW rows of every output plane (a 3x3 conv of 16 channels at 32x32: 590 KB,
 * more than L2) and the SGEMM reads them back; for a narrow weight (few output channels) that copy and
 * its traffic cost more than the multiply-adds. Here the input is copied once into a zero-padded plane
 * (width: the output rounded up to whole 8-column vectors plus the kernel's width minus one, so every
 * load is in bounds and needs no mask), and each tile of up to 4 output channels x 3 vectors of 8
 * output columns (12 ymm accumulators; a vector is 8 columns of one output row, a tile's vectors may
 * span rows) accumulates k = (c, kh, kw) in ascending order with one FMA per k from zero, adds the bias
 * and applies the epilogue (clip, then HardSwish): the same operations in the same order as the SGEMM
 * over im2col's columns (sg_ntask_avx2 / sg_micro2), so the same values. Tasks are fixed blocks of
 * (image, group, vectors) chosen from the shape only; the values do not depend on the thread count.
 * Portable build: the same loops in scalar C. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "im2col.h"
#include "pool.h"
#include "rnn_module.h"
#include "sgemm.h"
#include "tl_scratch.h"

#define AI static inline __attribute__((always_inline))

typedef struct {
    const float *xp;   /* zero-padded input [B][C][Hp][Wp] */
    const float *a;    /* packed weights [G][P][K][16] */
    const float *bias; /* [G*M] or NULL */
    float *y;          /* [B][G*M][OH][OW] */
    const long *koff;  /* per k = (c, kh, kw): its input offset c * Hp * Wp + kh * Wp + kw */
    long B, C, G, M, K, KH, KW, Hp, Wp, OH, OW, P, vpr, nvec, per_task, ntpp;
    float lo, hi;
    int act;     /* sgemm.h's SG_ACT_* */
    float alpha; /* LeakyRelu's slope */
} cd_job;

enum { CD_V = 3, CD_R = 4 }; /* 12 accumulators, 3 vectors of x and a broadcast: 16 ymm */

/* the vectors [v0, v0 + CD_V) of a plane: input offsets (row * Wp + column), output offsets and
 * widths; past the plane's last vector the last one is repeated with width 0 (computed, not stored) */
static int cd_vectors(const cd_job *j, long v0, long *off, long *yoff, int *cnt)
{
    int n = 0;
    for (int v = 0; v < CD_V; v++) {
        const long s = v0 + v < j->nvec ? v0 + v : j->nvec - 1;
        const long oy = s / j->vpr, ox = (s % j->vpr) * 8;
        off[v] = oy * j->Wp + ox;
        yoff[v] = oy * j->OW + ox;
        cnt[v] = v0 + v < j->nvec ? (int)(j->OW - ox < 8 ? j->OW - ox : 8) : 0;
        n += cnt[v] > 0;
    }
    return n;
}

AI float cd_epilogue1(float v, float lo, float hi, int act, float alpha)
{
    v = v < lo ? lo : v; /* NaN stays NaN, as max/min with the value second */
    v = v > hi ? hi : v;
    if (act == SG_ACT_LEAKY) return v < 0.0f ? v * alpha : v;
    if (act) {
        float h = v * (1.0f / 6.0f) + 0.5f;
        h = h < 0.0f ? 0.0f : h;
        h = h > 1.0f ? 1.0f : h;
        v = v * h;
    }
    return v;
}

/* ---- portable ---- */
static void cd_tile_portable(const cd_job *j, const float *xc, const float *ap, const long *off, float *y0,
                             const long *yoff, const int *cnt, const float *bias, int R)
{
    float acc[CD_R][CD_V][8];
    memset(acc, 0, sizeof acc);
    for (long k = 0; k < j->K; k++) {
        const float *ak = ap + k * SG_PANEL, *row = xc + j->koff[k];
        for (int v = 0; v < CD_V; v++) {
            const float *s = row + off[v];
            for (int i = 0; i < R; i++)
                for (int l = 0; l < 8; l++) acc[i][v][l] += ak[i] * s[l];
        }
    }
    const long ps = j->OH * j->OW;
    for (int i = 0; i < R; i++) {
        const float b = bias ? bias[i] : 0.0f;
        for (int v = 0; v < CD_V; v++)
            for (int l = 0; l < cnt[v]; l++)
                y0[i * ps + yoff[v] + l] = cd_epilogue1(acc[i][v][l] + b, j->lo, j->hi, j->act, j->alpha);
    }
}

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2,fma")
AI __m256 cd_epilogue8(__m256 v, __m256 lo, __m256 hi, int act, float alpha)
{
    v = _mm256_min_ps(hi, _mm256_max_ps(lo, v)); /* max/min return their second operand on NaN: NaN stays */
    if (act == SG_ACT_LEAKY) /* false on NaN: NaN stays */
        return _mm256_blendv_ps(v, _mm256_mul_ps(v, _mm256_set1_ps(alpha)),
                                _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    if (act) {
        __m256 h = _mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.0f / 6.0f)), _mm256_set1_ps(0.5f));
        h = _mm256_min_ps(_mm256_set1_ps(1.0f), _mm256_max_ps(_mm256_setzero_ps(), h));
        v = _mm256_mul_ps(v, h);
    }
    return v;
}

AI void cd_store(float *dst, __m256 v, int cnt)
{
    if (cnt == 8)
        _mm256_storeu_ps(dst, v);
    else if (cnt > 0)
        _mm256_maskstore_ps(dst, _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                            v);
}

/* the 12 accumulators are named variables, not an array: GCC kept an array's elements in registers but
 * still stored all of them to the stack at every k (a store per FMA: the store port, not the FMAs,
 * bounded the loop) */
#define CD_FMA3(i) \
    do { \
        const __m256 w = _mm256_broadcast_ss(ak + i); \
        c##i##0 = _mm256_fmadd_ps(w, x0, c##i##0); \
        c##i##1 = _mm256_fmadd_ps(w, x1, c##i##1); \
        c##i##2 = _mm256_fmadd_ps(w, x2, c##i##2); \
    } while (0)
#define CD_OUT3(i) \
    do { \
        const __m256 b = _mm256_set1_ps(bias ? bias[i] : 0.0f); \
        float *dst = y0 + i * ps; \
        cd_store(dst + yoff[0], cd_epilogue8(_mm256_add_ps(c##i##0, b), lo, hi, j->act, j->alpha), cnt[0]); \
        cd_store(dst + yoff[1], cd_epilogue8(_mm256_add_ps(c##i##1, b), lo, hi, j->act, j->alpha), cnt[1]); \
        cd_store(dst + yoff[2], cd_epilogue8(_mm256_add_ps(c##i##2, b), lo, hi, j->act, j->alpha), cnt[2]); \
    } while (0)

AI void cd_tile8(const cd_job *j, const float *xc, const float *ap, const long *off, float *y0, const long *yoff,
                 const int *cnt, const float *bias, const int R)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    const long o0 = off[0], o1 = off[1], o2 = off[2], K = j->K, *koff = j->koff;
    /* one loop over k (the offsets from a table): nested loops over (c, kh, kw) spilled the
     * accumulators to the stack at every iteration */
    for (long k = 0; k < K; k++) {
        const float *s = xc + koff[k], *ak = ap + k * SG_PANEL;
        const __m256 x0 = _mm256_loadu_ps(s + o0), x1 = _mm256_loadu_ps(s + o1), x2 = _mm256_loadu_ps(s + o2);
        CD_FMA3(0);
        if (R > 1) CD_FMA3(1);
        if (R > 2) CD_FMA3(2);
        if (R > 3) CD_FMA3(3);
    }
    const __m256 lo = _mm256_set1_ps(j->lo), hi = _mm256_set1_ps(j->hi);
    const long ps = j->OH * j->OW;
    CD_OUT3(0);
    if (R > 1) CD_OUT3(1);
    if (R > 2) CD_OUT3(2);
    if (R > 3) CD_OUT3(3);
}

static void cd_tile_avx2(const cd_job *j, const float *xc, const float *ap, const long *off, float *y0,
                         const long *yoff, const int *cnt, const float *bias, int R)
{
    if (R >= 4)
        cd_tile8(j, xc, ap, off, y0, yoff, cnt, bias, 4);
    else if (R == 3)
        cd_tile8(j, xc, ap, off, y0, yoff, cnt, bias, 3);
    else if (R == 2)
        cd_tile8(j, xc, ap, off, y0, yoff, cnt, bias, 2);
    else
        cd_tile8(j, xc, ap, off, y0, yoff, cnt, bias, 1);
}
#pragma GCC pop_options
#else
static void cd_tile_avx2(const cd_job *j, const float *xc, const float *ap, const long *off, float *y0,
                         const long *yoff, const int *cnt, const float *bias, int R)
{
    cd_tile_portable(j, xc, ap, off, y0, yoff, cnt, bias, R);
}
#endif

typedef void (*cd_tile_fn)(const cd_job *, const float *, const float *, const long *, float *, const long *,
                           const int *, const float *, int);
static cd_tile_fn g_cd_tile = cd_tile_portable; /* set per call under the GIL */

/* task t: plane (image, group) t / ntpp, vectors [per_task * (t % ntpp), ...), every output channel */
static void cd_task(void *ctx, int t)
{
    const cd_job *j = (const cd_job *)ctx;
    const long bg = t / j->ntpp, b = bg / j->G, g = bg % j->G, cg = j->C / j->G;
    const long v0 = (t % j->ntpp) * j->per_task, v1 = v0 + j->per_task < j->nvec ? v0 + j->per_task : j->nvec;
    const float *xc = j->xp + ((size_t)b * j->C + (size_t)g * cg) * j->Hp * j->Wp;
    const float *ag = j->a + (size_t)g * j->P * j->K * SG_PANEL;
    float *yg = j->y + ((size_t)b * j->G + g) * j->M * j->OH * j->OW;
    long off[CD_V], yoff[CD_V];
    int cnt[CD_V];
    for (long v = v0; v < v1; v += CD_V) {
        cd_vectors(j, v, off, yoff, cnt);
        for (long i = v1 - v; i < CD_V; i++) cnt[i] = 0; /* the next task's vectors */
        for (long m = 0, R; m < j->M; m += R) {
            const long p = m / SG_PANEL, r = m % SG_PANEL;
            R = j->M - m < CD_R ? j->M - m : CD_R;
            if (r + R > SG_PANEL) R = SG_PANEL - r; /* a tile stays in its panel */
            g_cd_tile(j, xc, ag + (size_t)p * j->K * SG_PANEL + r, off, yg + (size_t)m * j->OH * j->OW, yoff, cnt,
                      j->bias ? j->bias + g * j->M + m : NULL, (int)R);
        }
    }
}

static _Thread_local float *g_pad = NULL; /* the padded input, grown per thread */
static _Thread_local size_t g_pad_cap = 0;
static _Thread_local long *g_koff = NULL;
static _Thread_local long g_koff_cap = 0;

static void g_pad_free(void)
{
    free(g_pad);
    free(g_koff);
    tl_bytes(-(long long)(g_pad_cap * sizeof(float) + (size_t)g_koff_cap * sizeof(long)));
    g_pad = NULL;
    g_koff = NULL;
    g_pad_cap = 0;
    g_koff_cap = 0;
}

/* conv_direct(x, packed, bias|None, y, dims int64[12] = B C H W G M KH KW OH OW pt pl, lo, hi, act[, alpha]):
 * unit strides and dilations; pt, pl the leading pads (the output size fixes the trailing ones) */
PyObject *py_conv_direct(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "conv_direct takes 8 or 9 positional arguments");
        return NULL;
    }
    const double lo = PyFloat_AsDouble(args[5]), hi = PyFloat_AsDouble(args[6]);
    const long act = PyLong_AsLong(args[7]);
    const double alpha = nargs > 8 ? PyFloat_AsDouble(args[8]) : 0.0;
    if (PyErr_Occurred()) return NULL;
    if (act < 0 || act > SG_ACT_MAX) {
        PyErr_SetString(PyExc_ValueError, "conv_direct: act is 0, 1 or 2");
        return NULL;
    }
    Py_buffer bd, bx, ba, by, bb;
    memset(&bb, 0, sizeof bb);
    if (PyObject_GetBuffer(args[4], &bd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *ret = NULL;
    int have_x = 0, have_a = 0, have_y = 0;
    if (bd.len < 12 * 8) {
        PyErr_SetString(PyExc_ValueError, "conv_direct: dims needs 12 int64 values");
        goto done;
    }
    const long long *d = (const long long *)bd.buf;
    int bad = 0;
    for (int i = 0; i < 12; i++) bad |= d[i] < (i >= 10 ? 0 : 1) || d[i] > (1LL << 24);
    if (!bad) bad = d[1] % d[4] != 0 || d[10] >= d[6] || d[11] >= d[7];
    cd_job j;
    memset(&j, 0, sizeof j);
    j.B = (long)d[0], j.C = (long)d[1];
    const long H = (long)d[2], W = (long)d[3], pt = (long)d[10], pl = (long)d[11];
    j.G = (long)d[4], j.M = (long)d[5], j.KH = (long)d[6], j.KW = (long)d[7], j.OH = (long)d[8], j.OW = (long)d[9];
    if (!bad) bad = j.OH + j.KH - 1 < H + pt || j.OW + j.KW - 1 < pl + 1; /* the input rows fit the padded plane */
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "conv_direct: bad dims");
        goto done;
    }
    j.K = j.C / j.G * j.KH * j.KW;
    j.P = (j.M + SG_PANEL - 1) / SG_PANEL;
    j.vpr = (j.OW + 7) / 8;
    j.nvec = j.OH * j.vpr;
    j.Hp = j.OH + j.KH - 1;
    j.Wp = j.vpr * 8 + j.KW - 1;
    j.lo = (float)lo, j.hi = (float)hi, j.act = (int)act, j.alpha = (float)alpha;
    if (PyObject_GetBuffer(args[0], &bx, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_x = 1;
    if (PyObject_GetBuffer(args[1], &ba, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_a = 1;
    if (args[2] != Py_None && PyObject_GetBuffer(args[2], &bb, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[3], &by, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    have_y = 1;
    if (bx.len < 4 * (Py_ssize_t)j.B * j.C * H * W || ba.len < 4 * (Py_ssize_t)j.G * j.P * j.K * SG_PANEL ||
        by.len < 4 * (Py_ssize_t)j.B * j.G * j.M * j.OH * j.OW || (bb.obj && bb.len < 4 * (Py_ssize_t)j.G * j.M)) {
        PyErr_SetString(PyExc_ValueError, "conv_direct: a buffer is smaller than its shape");
        goto done;
    }
    const size_t need = (size_t)j.B * j.C * j.Hp * j.Wp;
    if (need > g_pad_cap) {
        float *p = (float *)realloc(g_pad, need * sizeof(float));
        if (!p) {
            PyErr_NoMemory();
            goto done;
        }
        if (!g_pad && !g_koff) tl_at_exit(g_pad_free);
        tl_bytes((long long)((need - g_pad_cap) * sizeof(float)));
        g_pad = p;
        g_pad_cap = need;
    }
    if (j.K > g_koff_cap) {
        long *k = (long *)realloc(g_koff, (size_t)j.K * sizeof(long));
        if (!k) {
            PyErr_NoMemory();
            goto done;
        }
        if (!g_pad && !g_koff) tl_at_exit(g_pad_free);
        tl_bytes((long long)((size_t)(j.K - g_koff_cap) * sizeof(long)));
        g_koff = k;
        g_koff_cap = j.K;
    }
    for (long c = 0, k = 0; c < j.C / j.G; c++)
        for (long ky = 0; ky < j.KH; ky++)
            for (long kx = 0; kx < j.KW; kx++) g_koff[k++] = (c * j.Hp + ky) * j.Wp + kx;
    j.koff = g_koff;
    j.a = (const float *)ba.buf;
    j.y = (float *)by.buf;
    j.bias = bb.obj ? (const float *)bb.buf : NULL;
    /* about 2^18 multiply-adds per task (at least one tile of vectors), fixed by the shape */
    const double per_vec = 8.0 * (double)j.M * (double)j.K;
    long per = (long)((double)(1 << 18) / per_vec);
    per = per < CD_V ? CD_V : per / CD_V * CD_V;
    if (per > j.nvec) per = j.nvec;
    j.per_task = per;
    j.ntpp = (j.nvec + per - 1) / per;
    const long ntasks = j.B * j.G * j.ntpp;
    const int level = ext_isa_level();
    g_cd_tile = level >= 1 ? cd_tile_avx2 : cd_tile_portable;
    const float *x = (const float *)bx.buf;
    float *xp = g_pad;
    Py_BEGIN_ALLOW_THREADS
    memset(xp, 0, need * sizeof(float));
    const long cols = W < j.Wp - pl ? W : j.Wp - pl;
    for (long pc = 0; pc < j.B * j.C; pc++)
        for (long r = 0; r < H; r++)
            memcpy(xp + ((size_t)pc * j.Hp + r + pt) * j.Wp + pl, x + ((size_t)pc * H + r) * W,
                   (size_t)cols * sizeof(float));
    j.xp = xp;
    if (ntasks > 1 && nb_pool_get_threads() > 1 && per_vec * (double)j.nvec * (double)(j.B * j.G) >= (double)(1 << 21))
        nb_pool_run(cd_task, &j, (int)ntasks);
    else
        for (long t = 0; t < ntasks; t++) cd_task(&j, (int)t);
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    if (have_y) PyBuffer_Release(&by);
    if (bb.obj) PyBuffer_Release(&bb);
    if (have_a) PyBuffer_Release(&ba);
    if (have_x) PyBuffer_Release(&bx);
    PyBuffer_Release(&bd);
    return ret;
}
