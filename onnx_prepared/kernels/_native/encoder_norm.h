/* Entry point of encoder_norm.c (LayerNormalization, optionally of a sum) for module.c's method table
 * (reached through ENCODER_ACT_METHODS, encoder_act.h). */
#ifndef ONNX_PREPARED_ENCODER_NORM_H
#define ONNX_PREPARED_ENCODER_NORM_H

#include <Python.h>

PyObject *py_layer_norm_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define ENCODER_NORM_METHODS                                                                                \
    {"layer_norm_f32", (PyCFunction)(void (*)(void))py_layer_norm_f32, METH_FASTCALL,                      \
     "LayerNormalization over the rows of a float32 matrix (of x + skip), onnxruntime's operation order"},

#endif
