"""Text generation from a genai model folder, in the shape of onnxruntime-genai's Python API.

>>> import onnx_prepared.genai as og      # was: import onnxruntime_genai as og
>>> model = og.Model("phi-3-mini-int4")   # genai_config.json + model.onnx (+ tokenizer.json for text)

The folder layout is onnxruntime-genai's (its model builder writes it). Text needs the optional
``tokenizers`` library: ``pip install 'onnx-prepared[genai]'``. The CLI is ``onnx-prepared generate-text``.
"""

from onnx_prepared.genai.config import GenaiConfig, load_config
from onnx_prepared.lazy import lazy_attributes

# The generator (a runtime session) and the tokenizer load on first use: the CLI's start and --help
# import this package to add `generate-text`.
_LAZY = {**dict.fromkeys(("Generator", "GeneratorParams", "Model"), "generator"),
         **dict.fromkeys(("Tokenizer", "TokenizerStream"), "tokenizer")}


__getattr__ = lazy_attributes(__name__, globals(), _LAZY)

__all__ = ["GenaiConfig", "Generator", "GeneratorParams", "Model", "Tokenizer", "TokenizerStream", "load_config"]
