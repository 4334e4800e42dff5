/* Entry points of encoder_act.c (Erf, GELU and Softmax of transformer encoders) for module.c's method table. */
#ifndef ONNX_PREPARED_ENCODER_ACT_H
#define ONNX_PREPARED_ENCODER_ACT_H

#include <Python.h>

#include "encoder_gemm.h"
#include "encoder_norm.h"

PyObject *py_erf_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_softmax_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_gelu_erf_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ENCODER_ACT_METHODS                                                                                 \
    {"erf_f32", (PyCFunction)(void (*)(void))py_erf_f32, METH_FASTCALL,                                    \
     "erf of float32, activation.py's rational approximation in its float32 operations"},                  \
    {"softmax_f32", (PyCFunction)(void (*)(void))py_softmax_f32, METH_FASTCALL,                            \
     "Softmax over the rows of a float32 matrix"},                                                          \
    {"gelu_erf_f32", (PyCFunction)(void (*)(void))py_gelu_erf_f32, METH_FASTCALL,                          \
     "exact GELU (x * (erf(x / d) + a)) * m of float32, the unfused graph's float32 operations"},         \
    ENCODER_NORM_METHODS                                                                                    \
    ENCODER_GEMM_METHODS

#endif
