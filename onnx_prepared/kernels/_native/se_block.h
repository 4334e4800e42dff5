/* A squeeze-and-excitation block with a HardSigmoid gate in one call (se_block.c). */
#ifndef ONNX_PREPARED_SE_BLOCK_H
#define ONNX_PREPARED_SE_BLOCK_H

#include <Python.h>

typedef struct {
    const float *x, *w1t, *b1, *w2t, *b2; /* w1t [C][R], w2t [R][C]: the 1x1 weights transposed */
    float *y, *buf; /* buf: 2 C + R floats of scratch */
    long N, C, P, R;
    float alpha, beta;
} se_job;

void se_run_portable(const se_job *j);
void se_run_avx2(const se_job *j);
void se_run_avx512(const se_job *j);

PyObject *py_se_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define SE_BLOCK_METHODS \
    {"se_block", (PyCFunction)(void (*)(void))py_se_block, METH_FASTCALL, "squeeze-excite, HardSigmoid gate"},

#endif
