/* Entry point of encoder_gemm.c (small float32 products with a bias, MatMulBias) for module.c's method
 * table (reached through ENCODER_ACT_METHODS, encoder_act.h). */
#ifndef ONNX_PREPARED_ENCODER_GEMM_H
#define ONNX_PREPARED_ENCODER_GEMM_H

#include <Python.h>

PyObject *py_gemm_bias_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ENCODER_GEMM_METHODS                                                                                \
    {"gemm_bias_f32", (PyCFunction)(void (*)(void))py_gemm_bias_f32, METH_FASTCALL,                        \
     "y = a @ w (+ bias), small float32 products, w row-major [K, N]"},

#endif
