/* 2-D MaxPool / AveragePool, NCHW float32 (winpool.c, winpool.inc per ISA). */
#ifndef ONNX_PREPARED_WINPOOL_H
#define ONNX_PREPARED_WINPOOL_H

#include <Python.h>

typedef struct {
    const float *x;
    float *y;
    long N, C, H, W, KH, KW, OH, OW, pt, pl, pb, pr, sh, sw, dh, dw, planes_per_task;
    int avg;         /* 0: max (NaN propagates), 1: mean over the window's taps */
    int include_pad; /* average: taps in the explicitly padded input count, ceil-mode overhang never */
    int *failed;     /* set by a task that could not get its scratch */
} wp_job;

/* The scratch of one plane (winpool.inc): the padded plane (hp rows of owp * sw columns, then the
 * horizontal taps' overhang), the horizontal pass (hp + sh rows of owp), the vertical pass (OH rows of
 * sh * owp), the column divisors (OW). */
static inline long wp_owp(const wp_job *j)
{
    long span = (j->OW - 1) * j->sw + (j->KW - 1) * j->dw + 1;
    if (span < j->pl + j->W) span = j->pl + j->W;
    return (span + j->sw - 1) / j->sw;
}
static inline long wp_hp(const wp_job *j)
{
    const long span = (j->OH - 1) * j->sh + (j->KH - 1) * j->dh + 1;
    return span > j->pt + j->H ? span : j->pt + j->H;
}
static inline long wp_pad_len(const wp_job *j) { return wp_hp(j) * wp_owp(j) * j->sw + (j->KW - 1) * j->dw; }
static inline long wp_hz_len(const wp_job *j) { return (wp_hp(j) + j->sh) * wp_owp(j); }
static inline long wp_ob_len(const wp_job *j) { return j->OH * j->sh * wp_owp(j); }
static inline size_t wp_scratch_len(const wp_job *j)
{
    return (size_t)(wp_pad_len(j) + wp_hz_len(j) + wp_ob_len(j) + j->OW);
}

/* task t of a job: its block of output planes (winpool.inc, one build per ISA) */
void wp_planes_portable(const wp_job *j, int t);
void wp_planes_avx2(const wp_job *j, int t);
void wp_planes_avx512(const wp_job *j, int t);
/* MaxPool at AVX-512 straight from the input (no scratch copies) when wp_max_direct_ok: each output the
 * same reduction as plane()'s (the horizontal taps in order, then the rows in order, padding skipped:
 * reduce(-inf, v) is v and reduce(acc, -inf) is acc, bit for bit), so the same bits */
int wp_max_direct_ok(const wp_job *j);
void wp_planes_max_avx512(const wp_job *j, int t);


PyObject *py_pool2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define WINPOOL_METHODS \
    {"pool2d", (PyCFunction)(void (*)(void))py_pool2d, METH_FASTCALL, "2-D Max/AveragePool, NCHW float32"},

#endif
