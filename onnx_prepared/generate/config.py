"""The tiny INT4 LLM's shape: one frozen config, three presets, and exact size arithmetic.

The default preset is the spec's "Tiny INT4 LLM example" (4 blocks, hidden 512, intermediate 2048,
vocabulary 8192, INT4 group size 32). ``medium`` and ``large`` scale the same graph up for benchmarks.
``embedding="fp32"`` gives onnxruntime-genai's builder default instead of the tied INT4 embedding: an
untied float32 embedding table (a plain Gather) and a separate INT4 LM head.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

# Bumped whenever the generator's output bytes change for the same arguments.
FORMAT_VERSION = 1
CONFIG_KEY = "onnx_prepared.tiny_llm.config"
GENERATOR_KEY = "onnx_prepared.generator"


@dataclass(frozen=True, slots=True)
class TinyLlmConfig:
    """Dimensions and generation settings of one tiny LLM. Same config, byte-identical files.

    >>> TinyLlmConfig().head_dim
    64
    >>> TinyLlmConfig.from_preset("medium", seed=3).layers
    16
    """

    layers: int = 4
    hidden: int = 512
    intermediate: int = 2048
    heads: int = 8
    kv_heads: int = 8
    vocab: int = 8192
    seed: int = 0
    block_size: int = 32  # INT4 group size along K (MatMulNBits / GatherBlockQuantized block_size)
    context_length: int = 2048  # rows of the rotary cos/sin caches = longest supported sequence
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    init_std: float = 0.02  # normal std of projection / embedding weights before quantization
    accuracy_level: int = 4  # MatMulNBits accuracy_level; 4 (int8 compute) is genai's CPU default
    # "tied": the LM head's INT4 weight doubles as the embedding (GatherBlockQuantized); "fp32": genai's
    # builder default, a float32 embedding table (Gather) and a separate INT4 LM head
    embedding: str = "tied"

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"tiny-llm config: {f.name} must be an int, got {v!r}")
        positive = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "block_size", "context_length")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"tiny-llm config: {name} must be positive, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"tiny-llm config: seed must be >= 0, got {self.seed}")
        if self.hidden % self.heads:
            raise ValueError(f"tiny-llm config: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"tiny-llm config: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"tiny-llm config: head_dim {self.head_dim} must be even for rotary embeddings")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"tiny-llm config: block_size must be a power of two >= 16, got {self.block_size}")
        for name in ("hidden", "intermediate"):
            if getattr(self, name) % self.block_size:
                raise ValueError(f"tiny-llm config: {name} {getattr(self, name)} is not a multiple of "
                                 f"block_size {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"tiny-llm config: accuracy_level must be 0..4, got {self.accuracy_level}")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"tiny-llm config: embedding must be one of {', '.join(EMBEDDINGS)}, got "
                             f"{self.embedding!r}")

    # ---- derived dimensions -------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_out(self) -> int:
        """Output features of the fused QKV projection: Q heads, then K heads, then V heads."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def tied(self) -> bool:
        return self.embedding == "tied"

    def projections(self) -> list[tuple[str, int, int]]:
        """(logical name, K = input features, N = output features) of every INT4 matrix, in file order.

        The LM head is ``emb`` when tied (first: the embedding reads it), ``lm_head`` when untied (last).
        """
        out = [("emb", self.hidden, self.vocab)] if self.tied else []
        for i in range(self.layers):
            out += [
                (f"layer{i}.qkv", self.hidden, self.qkv_out),
                (f"layer{i}.attn_out", self.heads * self.head_dim, self.hidden),
                (f"layer{i}.gate_up", self.hidden, 2 * self.intermediate),
                (f"layer{i}.down", self.intermediate, self.hidden),
            ]
        return out if self.tied else out + [("lm_head", self.hidden, self.vocab)]

    # ---- sizes ----------------------------------------------------------------------------------

    @property
    def num_parameters(self) -> int:
        """Logical parameters (a tied embedding counted once)."""
        matrices = sum(k * n for _, k, n in self.projections())
        untied = 0 if self.tied else self.vocab * self.hidden
        return matrices + untied + (2 * self.layers + 1) * self.hidden

    @property
    def int4_bytes(self) -> int:
        """Packed INT4 weights plus their float32 group scales (what MatMulNBits reads)."""
        return sum(n * (k // 2) + n * (k // self.block_size) * 4 for _, k, n in self.projections())

    @property
    def payload_bytes(self) -> int:
        """All tensor bytes in the data file, before alignment padding."""
        norms = (2 * self.layers + 1) * self.hidden * 4
        rope = 2 * self.context_length * (self.head_dim // 2) * 4
        table = 0 if self.tied else self.vocab * self.hidden * 4  # the untied float32 embedding
        return self.int4_bytes + norms + rope + table

    def kv_cache_bytes(self, tokens: int, itemsize: int = 4) -> int:
        """Caller-owned KV-cache size for ``tokens`` positions (batch 1)."""
        return self.layers * 2 * tokens * self.kv_heads * self.head_dim * itemsize

    # ---- (de)serialization ----------------------------------------------------------------------

    def to_json(self) -> str:
        d = asdict(self)
        if d["embedding"] == "tied":
            del d["embedding"]  # the field's default is left out: tied models stay byte-identical
        return json.dumps({"format_version": FORMAT_VERSION, **d}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TinyLlmConfig:
        d = json.loads(text)
        d.pop("format_version", None)
        return cls(**d)

    @classmethod
    def from_model(cls, model: str | onnx.ModelProto) -> TinyLlmConfig:
        """The config a generated model was built from (read from its metadata_props)."""
        import onnx

        if not isinstance(model, onnx.ModelProto):
            model = onnx.load(model, load_external_data=False)
        for p in model.metadata_props:
            if p.key == CONFIG_KEY:
                return cls.from_json(p.value)
        raise ValueError(f"model has no {CONFIG_KEY!r} metadata: not generated by onnx_prepared.generate")

    @classmethod
    def from_preset(cls, preset: str | None = None, **overrides: int | float | None) -> TinyLlmConfig:
        """A preset's config with every non-None override applied."""
        name = preset or "tiny"
        if name not in PRESETS:
            raise ValueError(f"unknown tiny-llm preset {name!r}; choose one of {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown tiny-llm config field(s): {', '.join(sorted(unknown))}")
        return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


EMBEDDINGS = ("tied", "fp32")

PRESETS: dict[str, TinyLlmConfig] = {
    # The spec's example model.
    "tiny": TinyLlmConfig(),
    # ~213 M parameters (~246 M if the embedding were untied), ~134 MB of INT4 + scales.
    "medium": TinyLlmConfig(layers=16, hidden=1024, intermediate=2816, heads=16, kv_heads=4, vocab=32000),
    # ~1.5 B parameters, ~0.94 GB of INT4 + scales (TinyLlama-1.1B's dims with 32 instead of 22 blocks).
    "large": TinyLlmConfig(layers=32, hidden=2048, intermediate=5632, heads=32, kv_heads=8, vocab=32000),
}
