/* Prepacked SGEMM for Conv (sgemm.c): y[b][g] = A[g] @ x[b][g] (+ bias, clipped), A prepacked once. */
#ifndef ONNX_PREPARED_SGEMM_H
#define ONNX_PREPARED_SGEMM_H

#include <Python.h>

/* The packed weight layout, the same at every dispatch level: A[g] ([M, K] row-major) as
 * ceil(M/16) panels of 16 rows, each panel K-major ([K][16], rows past M zero). */
enum { SG_PANEL = 16, SG_NCHUNK_ALIGN = 12 };

/* the epilogue's activation after the clip (the ``act`` argument of sgemm_packed, depthwise2d and
 * conv_direct; native.py's ACT_* codes) */
enum { SG_ACT_NONE = 0, SG_ACT_HARDSWISH = 1, SG_ACT_LEAKY = 2, SG_ACT_MAX = 2 };

typedef struct {
    const float *a; /* [G][P][K][16] */
    const float *x; /* [B][G][K][N] */
    float *y;       /* [B][G][M][N] */
    const float *bias; /* [G*M] or NULL */
    long G, M, K, N, P;  /* P = ceil(M / 16) */
    long mchunk, nchunk; /* panels (even) and columns (multiple of 12) per task */
    long nmc, nnc;       /* tasks along the panels and along the columns, per (b, g) */
    float lo, hi;        /* the epilogue's clip (-inf, +inf: none) */
    int act;             /* then SG_ACT_*: nothing, HardSwish (v * clip(v / 6 + 1/2, 0, 1)), LeakyRelu */
    float alpha;         /* LeakyRelu's slope (v < 0 ? alpha * v : v) */
} sg_job;

/* task t of a job (sgemm_isa.c, one build per ISA) */
void sg_task_portable(const sg_job *j, int t);
void sg_task_avx2(const sg_job *j, int t);
void sg_task_avx512(const sg_job *j, int t);
/* the AVX-512 task vectorised along the columns (same values as sg_task_avx512), for N >= SG_NCOLS_MIN
 * and K <= SG_NCOLS_MAXK: there the row task's scalar epilogue dominates; from K ~ 64 on the row task is
 * faster (measured per column, one thread: M=64, K=576 354 vs 882 ns; K=16 75 vs 58 ns) */
void sg_ntask_avx512(const sg_job *j, int t);
enum { SG_NCOLS_MIN = 32, SG_NCOLS_MAXK = 32 };
/* the AVX2 task vectorised along the columns (6 rows x 16 columns, same values as sg_task_avx2), for
 * N >= 16 and M <= SG_NCOLS2_MAXM: there the row task's one panel is at least half padding (measured
 * per call, one thread: M=8, K=27, N=1024 32 vs 24 us; K=288, N=256 67 vs 58 us; M=3, K=8 11 vs 3.5 us);
 * with full panels the row task is faster (M=16, K=72, N=256 20 vs 27 us) */
void sg_ntask_avx2(const sg_job *j, int t);
enum { SG_NCOLS2_MAXM = 8 };

/* A 2-D Conv (one group) on the packed panels without a column matrix, AVX-512 (sgemm_isa.c): the same
 * micro tile as sg_task_avx512, its column k read from a zero-padded copy of the image at off[k] (k = (c,
 * kh, kw), im2col's order), a tile being up to 12 outputs of one row at column stride SW (1 or 2): the
 * same FMA chains as im2col + sg_task_avx512, so the same bits. */
typedef struct {
    const float *a;    /* [P][K][16] */
    const float *xp;   /* [B][C][HP][WP], zeros around the image */
    float *y;          /* [B][M][OH][OW] */
    const float *bias; /* [M] or NULL */
    const long *off;   /* [K]: c * HP * WP + kh * dh * WP + kw * dw */
    long M, K, P, OH, OW, HP, WP, sh, sw, mchunk, nmc, rows_per_task, nrb, img_stride;
    float lo, hi;
    int act;
    float alpha;
    const float *res;  /* [B][M][OH][OW] added after the bias, before the clip (act 0), or NULL */
} sg_cjob;
void sg_ctask_avx512(const sg_cjob *j, int t);
/* conv_implicit's zero-padded copy of `planes` [H][W] planes into [HP][WP] (row r - pt, column c - pl);
 * without `full` the zeros around them are not written (left by a copy of the same geometry) */
void sg_pad_avx512(const float *x, float *xp, long planes, long H, long W, long HP, long WP, long pt, long pl,
                   int full);

PyObject *py_sgemm_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_conv_implicit(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define SGEMM_METHODS \
    {"sgemm_packed", (PyCFunction)(void (*)(void))py_sgemm_packed, METH_FASTCALL, "Conv GEMM on prepacked weights"}, \
    {"conv_implicit", (PyCFunction)(void (*)(void))py_conv_implicit, METH_FASTCALL,                   \
     "one-group 2-D Conv on prepacked weights without a column matrix (AVX-512; False below)"},

#endif
