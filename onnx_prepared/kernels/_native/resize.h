/* Bilinear Resize of the last two axes, float32 (resize.c, resize.inc per ISA). */
#ifndef ONNX_PREPARED_RESIZE_H
#define ONNX_PREPARED_RESIZE_H

#include <Python.h>

typedef struct {
    const float *x;
    float *y;
    long P, H, W, OH, OW, planes_per_task;
    const long long *y1, *y2, *x1, *x2; /* the two input rows / columns of each output row / column */
    const long long *yout, *xout;       /* nonzero: the row / column takes the extrapolation value */
    const float *dy1, *dy2, *dx1, *dx2; /* dy1: the weight of row y2, dy2: of row y1 (onnxruntime's names) */
    float ev;
    int extrap;
    int *failed; /* set by a task that could not get its scratch */
} rl_job;

/* task t of a job: its block of planes (resize.inc, one build per ISA) */
void rl_planes_portable(const rl_job *j, int t);
void rl_planes_avx2(const rl_job *j, int t);
void rl_planes_avx512(const rl_job *j, int t);

PyObject *py_resize_linear2d(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define RESIZE_METHODS \
    {"resize_linear2d", (PyCFunction)(void (*)(void))py_resize_linear2d, METH_FASTCALL, \
     "bilinear Resize of the last two axes, float32, onnxruntime's 4-term sum"},

#endif
