/* Entry point of depthwise.c for module.c's method table. */
#ifndef ONNX_PREPARED_DEPTHWISE_H
#define ONNX_PREPARED_DEPTHWISE_H

#include <Python.h>

enum { DW_MAX_KW = 64 }; /* widest kernel the native path takes (conv.py checks) */

typedef struct {
    const float *x, *w, *b;
    float *y;
    long N, C, H, W, mult, KH, KW, OH, OW, pt, pl, sh, sw, dh, dw, planes_per_task;
} dw_job;

/* task t of a job: its block of output planes (depthwise.inc, one build per ISA) */
void dw_planes_portable(const dw_job *j, int t);
void dw_planes_avx2(const dw_job *j, int t);
void dw_planes_avx512(const dw_job *j, int t);

PyObject *py_depthwise2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define DEPTHWISE_METHODS \
    {"depthwise2d", (PyCFunction)(void (*)(void))py_depthwise2d, METH_FASTCALL, "2-D depthwise Conv, NCHW"},

#endif
