"""C sources of the compiled extension ``_ext`` (see :mod:`onnx_prepared.kernels.native`)."""
