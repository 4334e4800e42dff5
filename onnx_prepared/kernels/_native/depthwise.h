/* Entry point of depthwise.c for module.c's method table. */
#ifndef ONNX_PREPARED_DEPTHWISE_H
#define ONNX_PREPARED_DEPTHWISE_H

#include <Python.h>

enum { DW_MAX_KW = 64 }; /* widest kernel the native path takes (conv.py checks) */
enum { DW_VL = 16 };      /* the widest level's output columns per vector (depthwise.inc's DW_VEC) */

typedef struct {
    const float *x, *w, *b;
    float *y;
    long N, C, H, W, mult, KH, KW, OH, OW, pt, pl, sh, sw, dh, dw, planes_per_task;
    int *failed; /* set by a task that could not get its scratch */
    float lo, hi; /* the epilogue's clip (-inf, +inf: none) */
    int act;      /* then 0: nothing, 1: HardSwish, 2: LeakyRelu */
    float alpha;  /* LeakyRelu's slope */
    /* the channels-last task's taps (depthwise.c builds them per call): output position q reads the pairs
     * e in [cl_start[q], cl_start[q + 1]), input position cl_pos[e] times used tap cl_tap[e], in (ki, kj)
     * order; cl_used[u] is the kernel tap of used tap u (taps that no output reads inside the input are
     * left out: a 4x4 plane under a 5x5 kernel dilated by 2 reads 9 of 25) */
    const int *cl_start, *cl_pos, *cl_tap, *cl_used;
    long cl_nused;
} dw_job;

/* rows of the padded input plane the output reads, and the width of one of its sw phase rows (with
 * DW_VL columns of slack for the last run's full-width reads) */
static inline long dw_padded_rows(const dw_job *j) { return (j->OH - 1) * j->sh + (j->KH - 1) * j->dh + 1; }
static inline long dw_phase_width(const dw_job *j)
{
    const long span = (j->OW - 1) * j->sw + (j->KW - 1) * j->dw + 1;
    return (span + j->sw - 1) / j->sw + DW_VL;
}


/* task t of a job: its block of output planes (depthwise.inc, one build per ISA) */
void dw_planes_portable(const dw_job *j, int t);
void dw_planes_avx2(const dw_job *j, int t);
void dw_planes_avx512(const dw_job *j, int t);

/* the small-plane task (channels last): task t is image t / ceil(C / DW_CL_BLOCK), one block of channels;
 * taken for one-channel groups with mult 1 and input planes of at most DW_CL_MAX_PLANE elements, with
 * the job's cl_* tap lists */
enum { DW_CL_BLOCK = 64, DW_CL_MAX_PLANE = 64, DW_CL_T8_TAPS = 64 };
void dw_cl_portable(const dw_job *j, int t);
void dw_cl_avx2(const dw_job *j, int t);
void dw_cl_avx512(const dw_job *j, int t);

/* the channel-blocked task (depthwise.inc): task t is image t / ceil(C / lanes), one block of as many
 * channels as the level's vector has lanes; taken for mult 1 when its scratch (padded block, weights,
 * output block) stays within DW_BLK_MAX_FLOATS at the widest level */
enum { DW_BLK_MAX_FLOATS = 1 << 16, DW_BLK_WIDE_FLOATS = 24576 };
void dw_blk_portable(const dw_job *j, int t);
void dw_blk_avx2(const dw_job *j, int t);
void dw_blk_avx512(const dw_job *j, int t);
static inline long dw_blk_lanes(int level) { return level >= 3 ? 16 : level >= 1 ? 8 : 4; }
static inline double dw_blk_floats(const dw_job *j, long lanes)
{
    const double wp = (double)((j->OW - 1) * j->sw + (j->KW - 1) * j->dw + 1);
    return ((double)dw_padded_rows(j) * wp + (double)(j->KH * j->KW) + (double)(j->OH * j->OW)) * (double)lanes;
}

PyObject *py_depthwise2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define DEPTHWISE_METHODS \
    {"depthwise2d", (PyCFunction)(void (*)(void))py_depthwise2d, METH_FASTCALL, "2-D depthwise Conv, NCHW"},

#endif
