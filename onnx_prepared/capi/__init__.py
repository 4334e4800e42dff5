"""The names packages import from ``onnxruntime.capi`` (its pybind module, exceptions, inference
collection), mapped onto onnx-prepared, so ``sys.modules['onnxruntime'] = onnx_prepared`` lets such
imports resolve. Names onnx-prepared cannot provide (CUDA packers, EP libraries) raise
NotImplementedError when called, naming themselves."""
