/* Entry points of conv_gemm.c for module.c's method table. */
#ifndef ONNX_PREPARED_CONV_GEMM_H
#define ONNX_PREPARED_CONV_GEMM_H

#include <Python.h>

PyObject *py_conv_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_conv_gemm_set_blas(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define CONV_GEMM_METHODS                                                                               \
    {"conv_gemm", (PyCFunction)(void (*)(void))py_conv_gemm, METH_FASTCALL, "batched Conv GEMM over the pool"}, \
    {"conv_gemm_set_blas", (PyCFunction)(void (*)(void))py_conv_gemm_set_blas, METH_FASTCALL, "bind cblas_sgemm"},

#endif

