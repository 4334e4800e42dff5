"""onnxruntime's Python API around :class:`~onnx_prepared.InferenceSession`: the module-level enums and
helpers, ``OrtValue``, ``IOBinding``, provider requests, and input/output metadata as onnxruntime reports it.

Loaded on first use (``onnx_prepared.__getattr__``), so ``import onnx_prepared`` stays light.
"""
