/* Entry points of qlinear.c (QLinearConv/QGemm, QLinearAdd/Mul, QLinearGlobalAveragePool, per-tensor
 * QuantizeLinear/DequantizeLinear in MLAS's roundings) for module.c. */
#ifndef ONNX_PREPARED_QLINEAR_H
#define ONNX_PREPARED_QLINEAR_H

#include <Python.h>

PyObject *py_qconv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_qbinary(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_qgap(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_quantize_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_dequantize_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_qlookup(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* qconv_vnni.c: one-group QLinearConv on 8-bit operands at AVX-512 VNNI (False below that level) */
PyObject *py_qconv_vnni(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define QLINEAR_METHODS                                                                                        \
    {"qconv", (PyCFunction)(void (*)(void))py_qconv, METH_FASTCALL,                                           \
     "exact int32 convolution on centered int16 weights, + bias, requantized as MlasRequantizeOutput"},      \
    {"qbinary", (PyCFunction)(void (*)(void))py_qbinary, METH_FASTCALL,                                       \
     "QLinearAdd (op 0) / QLinearMul (op 1) in MLAS's float order"},                                          \
    {"qgap", (PyCFunction)(void (*)(void))py_qgap, METH_FASTCALL,                                             \
     "QLinearGlobalAveragePool: integer plane sums, requantized"},                                            \
    {"quantize_f32", (PyCFunction)(void (*)(void))py_quantize_f32, METH_FASTCALL,                             \
     "per-tensor QuantizeLinear of float32 into uint8/int8"},                                                 \
    {"dequantize_f32", (PyCFunction)(void (*)(void))py_dequantize_f32, METH_FASTCALL,                         \
     "per-tensor DequantizeLinear of uint8/int8 into float32"},                                               \
    {"qlookup", (PyCFunction)(void (*)(void))py_qlookup, METH_FASTCALL,                                       \
     "y = table[x] over 8-bit tensors (a tabulated Q(f(DQ(x))) chain)"},                                     \
    {"qconv_vnni", (PyCFunction)(void (*)(void))py_qconv_vnni, METH_FASTCALL,                                 \
     "qconv's values from uint8 x int8 vpdpbusd on channels-last input; False below AVX-512 VNNI"},

#endif
