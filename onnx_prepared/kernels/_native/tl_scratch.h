/* Per-thread scratch buffers that are freed when their thread exits.
 *
 * Kernels keep grown buffers in _Thread_local pointers so a model's calls reuse them. The process-wide
 * scheduler's threads live as long as the process, but a session with its own scheduler (a memory limit,
 * a trace) ends its worker threads at close, and without a hook every buffer those threads grew stayed
 * allocated: a ResNet-18 session per iteration, batch 32, grew RSS by ~20 MB each. A module registers its
 * free function with tl_at_exit() when it first allocates on a thread; the function runs when that thread
 * exits (a pthread key destructor). tl_bytes() keeps the bytes every thread holds, for tests. */
#ifndef ONNX_PREPARED_TL_SCRATCH_H
#define ONNX_PREPARED_TL_SCRATCH_H

#include <Python.h>

typedef void tl_free_fn(void);

/* Run fn when the calling thread exits (each fn once per thread; the main thread's run at no point). */
void tl_at_exit(tl_free_fn *fn);

/* Add delta to the bytes of per-thread scratch held by all threads. */
void tl_bytes(long long delta);

PyObject *py_thread_scratch_bytes(PyObject *self, PyObject *unused);

#define TL_SCRATCH_METHODS                                                                                        \
    {"thread_scratch_bytes", py_thread_scratch_bytes, METH_NOARGS,                                              \
     "bytes of per-thread kernel scratch (padded images, column buffers) held by all threads"},

#endif
