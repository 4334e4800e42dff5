/* Entry points of qgemm.c (the dynamic INT8 ops: DynamicQuantizeLinear, MatMulInteger, their fused chain) for module.c. */
#ifndef ONNX_PREPARED_QGEMM_H
#define ONNX_PREPARED_QGEMM_H

#include <Python.h>

PyObject *py_dql_u8(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_qgemm_i16(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_dq_matmul_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define QGEMM_METHODS                                                                                          \
    {"dql_u8", (PyCFunction)(void (*)(void))py_dql_u8, METH_FASTCALL,                                         \
     "DynamicQuantizeLinear of float32 into uint8: (scale, zero point), or None (NaN/inf: the caller's path)"}, \
    {"qgemm_i16", (PyCFunction)(void (*)(void))py_qgemm_i16, METH_FASTCALL,                                   \
     "exact int32 (A - a_zp) @ packed centered int16 B, A uint8 or int8"},                                    \
    {"dq_matmul_f32", (PyCFunction)(void (*)(void))py_dq_matmul_f32, METH_FASTCALL,                           \
     "DynamicQuantizeLinear, qgemm_i16 and the float rescale (+ bias) in one call; None on NaN/inf"},

#endif
