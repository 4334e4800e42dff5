"""Build of the optional native extension ``onnx_prepared.kernels._native._ext`` (everything else is in
pyproject.toml). A failed compile is reported and skipped: the package then runs on numpy."""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = "onnx_prepared/kernels/_native"
SOURCES = ["module.c", "pool.c", "nbits_portable.c", "nbits_avx2.c", "nbits_avx2vnni.c", "nbits_avx512vnni.c",
           "rnn_module.c", "rnn_portable.c", "rnn_avx2.c", "rnn_avx512.c", "conv_gemm.c",
           "depthwise.c", "depthwise_isa.c", "nms.c",
           "act.c", "sgemm.c", "sgemm_isa.c", "im2col.c", "im2col_direct.c", "gap.c",
           "attention.c", "attention_isa.c", "llm_norm.c", "llm_norm_isa.c", "prep_panels.c",
           "llm_gather.c",
           "winpool.c", "winpool_isa.c", "se_block.c", "se_block_isa.c", "qgemm.c", "qlinear.c", "qconv_vnni.c",
           "encoder_act.c", "encoder_norm.c", "encoder_gemm.c", "resize.c", "resize_isa.c", "silu.c",
           "tl_scratch.c"]


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing (no compiler, unsupported platform)."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # any build failure leaves the numpy fallback
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    @staticmethod
    def _skip(e: Exception) -> None:
        print(f"onnx-prepared: native extension not built ({type(e).__name__}: {e}); numpy fallback only",
              file=sys.stderr)


def _extensions() -> list[Extension]:
    if os.environ.get("ONNX_PREPARED_BUILD_NATIVE", "1") == "0" or sys.platform == "win32":
        return []
    return [Extension(
        "onnx_prepared.kernels._native._ext",
        sources=[f"{SRC}/{s}" for s in SOURCES],
        depends=[f"{SRC}/{h}" for h in ("nbits.h", "nbits_prep.h", "nbits_avx2.inc", "pool.h",
                                        "rnn.h", "rnn_module.h", "rnn_step.inc", "conv_gemm.h",
                                        "depthwise.h", "depthwise.inc", "nms.h",
                                        "act.h", "sgemm.h", "sgemm_task.inc",
                                        "attention.h", "attention.inc", "llm_norm.h", "llm_norm.inc", "prep_panels.h",
                                        "llm_gather.h",
                                        "im2col.h", "gap.h", "winpool.h", "winpool.inc", "se_block.h", "se_block.inc",
                                        "qgemm.h", "qlinear.h", "encoder_act.h", "encoder_norm.h", "encoder_gemm.h",
                                        "resize.h", "resize.inc", "silu.h", "logistic.h", "tl_scratch.h")],
        extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing", "-Wno-unknown-pragmas"],
        extra_link_args=["-pthread"],
        optional=True,
    )]


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
