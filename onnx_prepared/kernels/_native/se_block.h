/* A squeeze-and-excitation block with a HardSigmoid gate in one call (se_block.c). */
#ifndef ONNX_PREPARED_SE_BLOCK_H
#define ONNX_PREPARED_SE_BLOCK_H

#include <Python.h>

typedef struct {
    const float *x, *w1t, *b1, *w2t, *b2; /* w1t [C][R], w2t [R][C]: the 1x1 weights transposed */
    float *y;
    float *s, *h; /* scratch: the means [N][C], the hidden vectors [N][R] */
    long N, C, P, R;
    float alpha, beta;
} se_job;

/* The block's three phases over ranges of one image n (se_block.inc, one build per ISA); each element
 * is written by one call, so the phases may run on any threads in any split:
 *   means: s[n][c] for c in [c0, c1);
 *   hidden: h[n][r] = relu(b1[r] + sum_c s[n][c] W1t[c][r]) for r in [r0, r1) (needs every s[n]);
 *   excite: the gates of channels [c0, c1) from h[n] (needs every h[n]) and y's planes of them. */
typedef struct {
    void (*means)(const se_job *j, long n, long c0, long c1);
    void (*hidden)(const se_job *j, long n, long r0, long r1);
    void (*excite)(const se_job *j, long n, long c0, long c1);
} se_ops;

extern const se_ops se_ops_portable, se_ops_avx2, se_ops_avx512;

/* the vector blocks of the two products (floats): the hidden phase's and the excite phase's items are
 * multiples of SE_BLOCK */
enum { SE_BLOCK = 128 };

PyObject *py_se_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define SE_BLOCK_METHODS \
    {"se_block", (PyCFunction)(void (*)(void))py_se_block, METH_FASTCALL, "squeeze-excite, HardSigmoid gate"},

#endif
