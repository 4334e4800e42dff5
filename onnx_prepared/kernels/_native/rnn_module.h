/* Entry points of rnn_module.c for module.c's method table, and the dispatch level they read. */
#ifndef ONNX_PREPARED_RNN_MODULE_H
#define ONNX_PREPARED_RNN_MODULE_H

#include <Python.h>

/* index of the active dispatch level in module.c's LEVELS (0 = portable) */
int ext_isa_level(void);

PyObject *py_rnn_scratch_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_rnn_layer(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#define RNN_METHODS                                                                                      \
    {"rnn_scratch_bytes", (PyCFunction)(void (*)(void))py_rnn_scratch_bytes, METH_FASTCALL, "scratch for rnn_layer's recurrence"}, \
    {"rnn_layer", (PyCFunction)(void (*)(void))py_rnn_layer, METH_FASTCALL, "LSTM/GRU/RNN layer: projection, every direction"},

#endif
