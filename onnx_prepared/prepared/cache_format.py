"""The companion prepared ONNX model: its metadata convention, encoded and decoded.

The companion is a cache container, not a graph to execute: an empty graph whose initializers are
``UINT8`` 1-D tensors named ``prepared/<key>``, each with external data
``{location, offset, length, checksum}`` (``checksum`` = ``xxh3_128:`` + hex XXH3-128 of the payload
bytes, see ``payload_hash``) and the ``onnx_light.prepack.*`` metadata below. The model's own
``metadata_props`` carry the container format version, the payload checksum algorithm, the digest of
the portable source model it belongs to and the sidecar source digests (sha256: content identity).
Key names are the spec's interchange convention: do not rename them.

Decoding is metadata-only and collects every structural problem instead of stopping at the first, so
``verify`` can list them all and the store can raise on the first.
"""

from __future__ import annotations

import json
import os
import re

from google.protobuf.message import Error as ProtobufError

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import short
from onnx_prepared.model.strings import invalid_string_field
from onnx_prepared.prepared.payload_hash import ALGORITHM, is_checksum
from onnx_prepared.records import field, record

#: Version of the container format (model metadata) and of the per-entry packed-record convention.
#: 2: every payload is followed by its identity record; source stamps are stat fingerprints.
#: 3: 4-bit MatMulNBits weights in the panel16 layout (kernels/_q4_panels.py).
#: 4: payload checksums are XXH3-128 (``PAYLOAD_CHECKSUM_KEY``), not sha256.
#: 5: MatMulNBits panel16 payloads carry no header (K, N, block size and zero points come from the
#:    entry's layout key), so a packed entry is never larger than its source when N is a multiple of 16.
FORMAT_VERSION = "5"
#: Every payload starts at a multiple of this many bytes in its data file (page/direct-I/O friendly).
ALIGNMENT = 4096
#: The identity record right after each payload's bytes (after, so payloads stay aligned): magic, the
#: raw lineage digest, and sha256 of (entry name, layout, device). A payload thus names the prepared key
#: it was written for, and a companion index entry pointing at another entry's bytes (swapped or mislabelled
#: external data, whose checksum matches those bytes) is caught on read and by ``verify``.
ID_MAGIC = b"OPPAYID\x01"
ID_SIZE = len(ID_MAGIC) + 32 + 32

# ---- metadata keys (the spec's interchange convention) ----
P = "onnx_light.prepared."
FORMAT_KEY = P + "format_version"
SOURCE_MODEL_KEY = P + "source_model_digest"
ABI_KEY = P + "kernel_abi"
GENERATION_KEY = P + "generation"
ALIGNMENT_KEY = P + "alignment"
SOURCE_DIGESTS_KEY = P + "source_digests"  # JSON {source tensor name: hex sha256}
SOURCE_STAMPS_KEY = P + "source_stamps"  # JSON {source tensor name: change-detection stamp} (optional)
PAYLOAD_CHECKSUM_KEY = P + "payload_checksum"  # algorithm of every entry's checksum ("xxh3_128")

E = "onnx_light.prepack."
LINEAGE_DIGEST_KEY = E + "source_lineage_digest"
LINEAGE_KEY = E + "source_lineage"  # ordered source names joined by ","
LINEAGE_JSON_KEY = E + "source_lineage_json"  # exact JSON list (names may contain ","); preferred when present
LAYOUT_KEY = E + "layout"
DEVICE_KEY = E + "device"
ENTRY_ABI_KEY = E + "kernel_abi"
ENTRY_FORMAT_KEY = E + "format_version"
ENTRY_KEYS = (LINEAGE_DIGEST_KEY, LINEAGE_KEY, LAYOUT_KEY, DEVICE_KEY, ENTRY_ABI_KEY, ENTRY_FORMAT_KEY)

PREFIX = "prepared/"
_HEX = frozenset("0123456789abcdef")
#: IR 10 is the first with TensorProto.metadata_props; opset 21 is the matching default domain.
IR_VERSION, OPSET = 10, 21


@record(frozen=True)
class CacheEntry:
    """One persisted prepared object, as the companion index describes it (no payload byte read).

    ``file`` is absolute and was validated to lie inside the cache folder.
    """

    key_name: str
    lineage: tuple[str, ...]
    lineage_digest: str
    layout: str
    device: str
    kernel_abi: str
    format_version: str
    file: str
    offset: int
    length: int
    checksum: str  # hex XXH3-128 of the payload (no algorithm prefix)
    location: str = field(default="", compare=False)  # as written (relative to the cache folder)


@record
class CompanionIndex:
    """A decoded companion model, its index: top-level metadata, the entry table, and structural problems found.

    Not the payload manifest (:class:`~onnx_prepared.resolve.PayloadManifest`: which payloads a plan may read).
    """

    path: str
    meta: dict[str, str]
    entries: dict[str, CacheEntry]
    source_digests: dict[str, str]
    source_stamps: dict[str, str]
    problems: list[tuple[str, str]]  # (entry name or "", message): structural corruption
    # entries of a superseded layout version (``superseded``): left out of ``entries``, so no reader opens,
    # maps or hashes them, the next publication drops them and gc deletes what only they still reference
    superseded: dict[str, CacheEntry] = field(default_factory=dict)

    @property
    def format_version(self) -> str | None:
        return self.meta.get(FORMAT_KEY)

    @property
    def source_model_digest(self) -> str | None:
        return self.meta.get(SOURCE_MODEL_KEY)

    @property
    def generation(self) -> int:
        g = self.meta.get(GENERATION_KEY, "0")
        return int(g) if g.isdigit() else 0


def entry_name(lineage: tuple[str, ...], layout: str, device: str) -> str:
    """``prepared/<str(PreparedKey)>``; a non-CPU device is appended (``@cuda``) so variants cannot collide."""
    name = f"{PREFIX}{'+'.join(lineage)}@{layout}"
    return name if device == "cpu" else f"{name}@{device}"


def identity_record(name: str, lineage_digest: str, layout: str, device: str) -> bytes:
    """The ``ID_SIZE`` bytes written after the payload of entry ``name``."""
    import hashlib  # NOTE: lazy: a companion's index is read (and its stream started) before this is needed

    key = hashlib.sha256(f"{name}\0{layout}\0{device}".encode()).digest()
    return ID_MAGIC + bytes.fromhex(lineage_digest) + key


def identity_problem(record: bytes | bytearray | memoryview, entry: CacheEntry) -> str | None:
    """Why ``record`` (read after ``entry``'s payload) does not identify ``entry``; None when it does."""
    record = bytes(record)
    if len(record) != ID_SIZE or not record.startswith(ID_MAGIC):
        return "payload has no identity record (not written for this entry, or overwritten)"
    if record[len(ID_MAGIC):len(ID_MAGIC) + 32].hex() != entry.lineage_digest:
        return "payload was written for another source lineage digest (swapped or mislabelled entry)"
    if record != identity_record(entry.key_name, entry.lineage_digest, entry.layout, entry.device):
        return "payload was written for another prepared key (swapped or mislabelled entry)"
    return None


def is_sha256(value: str) -> bool:
    return len(value) == 64 and set(value) <= _HEX


# ---- encode ----------------------------------------------------------------------------------------


def encode(meta: dict[str, str], entries: list[CacheEntry], source_digests: dict[str, str],
           source_stamps: dict[str, str]) -> onnx.ModelProto:
    """The companion ModelProto for ``entries`` (their ``location`` fields must be set)."""
    model = onnx.ModelProto(ir_version=IR_VERSION, producer_name="onnx-prepared", producer_version=FORMAT_VERSION)
    model.opset_import.add(domain="", version=OPSET)
    model.graph.name = "onnx_prepared_cache"
    model.graph.doc_string = "prepared-weight cache container (not a graph to execute)"
    props = dict(meta)
    props[FORMAT_KEY] = FORMAT_VERSION
    props[ALIGNMENT_KEY] = str(ALIGNMENT)
    props[PAYLOAD_CHECKSUM_KEY] = ALGORITHM
    if source_digests:
        props[SOURCE_DIGESTS_KEY] = json.dumps(source_digests, sort_keys=True, separators=(",", ":"))
    if source_stamps:
        props[SOURCE_STAMPS_KEY] = json.dumps(source_stamps, sort_keys=True, separators=(",", ":"))
    for k in sorted(props):
        model.metadata_props.add(key=k, value=props[k])
    for e in sorted(entries, key=lambda e: e.key_name):
        t = model.graph.initializer.add(name=e.key_name, data_type=onnx.TensorProto.UINT8, dims=[e.length])
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", e.location), ("offset", str(e.offset)), ("length", str(e.length)),
                     ("checksum", f"{ALGORITHM}:{e.checksum}")):
            t.external_data.add(key=k, value=v)
        md = {
            LINEAGE_DIGEST_KEY: e.lineage_digest, LINEAGE_KEY: ",".join(e.lineage), LAYOUT_KEY: e.layout,
            DEVICE_KEY: e.device, ENTRY_ABI_KEY: e.kernel_abi, ENTRY_FORMAT_KEY: e.format_version,
        }
        if any("," in n for n in e.lineage):
            md[LINEAGE_JSON_KEY] = json.dumps(list(e.lineage))
        for k, v in md.items():
            t.metadata_props.add(key=k, value=v)
    return model


# ---- decode ----------------------------------------------------------------------------------------


def parse(data: bytes, path: str) -> onnx.ModelProto:
    """Parse companion bytes; a malformed one raises ValueError naming ``path`` (callers wrap it)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (ProtobufError, RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"companion prepared model {path!r} is not a valid ONNX protobuf: {e}") from None
    if not data or not model.HasField("graph"):
        raise ValueError(f"companion prepared model {path!r} is empty or has no graph (truncated?)")
    bad = invalid_string_field(model, "manifest", data)
    if bad is not None:  # protobuf hands invalid UTF-8 back as bytes; decode() and later code need str
        raise ValueError(f"companion prepared model {path!r}: string field {bad} is not valid UTF-8")
    return model


def decode(model: onnx.ModelProto, path: str, *, entries: bool = True) -> CompanionIndex:
    """Decode ``model`` (the companion at ``path``); ``entries=False`` reads only the top-level metadata."""
    meta = {p.key: p.value for p in model.metadata_props}
    m = CompanionIndex(os.path.abspath(path), meta, {}, {}, {}, [])
    for key, target in ((SOURCE_DIGESTS_KEY, m.source_digests), (SOURCE_STAMPS_KEY, m.source_stamps)):
        if key in meta:
            try:
                d = json.loads(meta[key])
                if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
                    raise ValueError("not an object of strings")
            except ValueError as e:
                m.problems.append(("", f"metadata {key} is not a JSON object of strings: {e}"))
            else:
                target.update(d)
    bad = [n for n, d in m.source_digests.items() if not is_sha256(d)]
    if bad:
        m.problems.append(("", f"metadata {SOURCE_DIGESTS_KEY}: {bad[0]!r} has no lower-case hex sha256"))
    for key in (FORMAT_KEY, SOURCE_MODEL_KEY):
        if not meta.get(key):
            m.problems.append(("", f"model metadata lacks {key}"))
    if m.format_version == FORMAT_VERSION and meta.get(PAYLOAD_CHECKSUM_KEY) != ALGORITHM:
        m.problems.append(("", f"metadata {PAYLOAD_CHECKSUM_KEY} is {meta.get(PAYLOAD_CHECKSUM_KEY)!r}, not "
                               f"{ALGORITHM!r}"))
    if not entries or m.format_version not in (None, FORMAT_VERSION):
        return m  # another format is a miss as a whole: its entries follow other rules
    folder = os.path.dirname(m.path)
    real_folder = os.path.realpath(folder)
    files: dict[str, str] = {}  # location -> resolved path: entries share a few data files
    for t in model.graph.initializer:
        try:
            e = _entry(t, folder, real_folder, files)
        except ValueError as err:
            m.problems.append((t.name, str(err)))
            continue
        if e.key_name in m.entries:
            m.problems.append((t.name, "duplicate entry name"))
            continue
        m.entries[e.key_name] = e
    for n in superseded(m.entries.values()):
        m.superseded[n] = m.entries.pop(n)
    return m


_VERSION = re.compile(r"-v(\d+)(?=-|$)")


def superseded(entries) -> set[str]:
    """Names of entries whose layout is an older version of another entry's layout for the same sources
    and device (``...-panel16-v1-...`` beside ``...-panel16-v2-...``: a layout version bump makes every
    current build write the new key and never ask for the old one again). Only the layout's version
    token is compared, never a source name; a layout without one is never superseded."""
    newest: dict[tuple, int] = {}
    versioned = []
    for e in entries:
        m = _VERSION.search(e.layout)
        if m is None:
            continue
        family = (e.lineage, e.device, e.kernel_abi, e.layout[:m.start()] + "-v*" + e.layout[m.end():])
        v = int(m.group(1))
        versioned.append((e.key_name, family, v))
        newest[family] = max(newest.get(family, v), v)
    return {n for n, family, v in versioned if v < newest[family]}


def _entry(t: onnx.TensorProto, folder: str, real_folder: str, files: dict[str, str]) -> CacheEntry:
    """One entry, or ValueError describing its structural problem (metadata only: no file is opened)."""
    if not t.name.startswith(PREFIX):
        raise ValueError(f"initializer name does not start with {PREFIX!r}")
    if t.data_type != onnx.TensorProto.UINT8 or len(t.dims) != 1:
        raise ValueError(f"must be a 1-D UINT8 tensor (data_type={t.data_type}, dims={list(t.dims)})")
    if t.data_location != onnx.TensorProto.EXTERNAL:
        raise ValueError("payload is not external (data_location != EXTERNAL)")
    info = {p.key: p.value for p in t.external_data}
    md = {p.key: p.value for p in t.metadata_props}
    missing = [k for k in ("location", "offset", "length", "checksum") if k not in info]
    missing += [k for k in ENTRY_KEYS if k not in md]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    for k in ("offset", "length"):
        if not (info[k].isascii() and info[k].isdigit()):
            raise ValueError(f"external data {k} {info[k]!r} is not a non-negative integer")
    offset, length = int(info["offset"]), int(info["length"])
    if length != t.dims[0]:
        raise ValueError(f"length {length} does not match dims {list(t.dims)}")
    algo, _, checksum = info["checksum"].lower().partition(":")
    if algo != ALGORITHM or not is_checksum(checksum):
        raise ValueError(f"checksum {short(info['checksum'])!r} is not {ALGORITHM}:<32 hex digits>")
    if not is_sha256(md[LINEAGE_DIGEST_KEY]):
        raise ValueError(f"{LINEAGE_DIGEST_KEY} {md[LINEAGE_DIGEST_KEY]!r} is not a hex sha256")
    lineage = _lineage(md)
    if t.name != entry_name(lineage, md[LAYOUT_KEY], md[DEVICE_KEY]):
        raise ValueError(f"name does not match its metadata (lineage {list(lineage)}, layout {md[LAYOUT_KEY]!r}, "
                         f"device {md[DEVICE_KEY]!r})")
    file = files.get(info["location"])
    if file is None:
        file = files[info["location"]] = resolve_location(info["location"], folder, real_folder)
    return CacheEntry(t.name, lineage, md[LINEAGE_DIGEST_KEY], md[LAYOUT_KEY], md[DEVICE_KEY], md[ENTRY_ABI_KEY],
                      md[ENTRY_FORMAT_KEY], file, offset, length, checksum, info["location"])


def _lineage(md: dict[str, str]) -> tuple[str, ...]:
    if LINEAGE_JSON_KEY in md:
        try:
            names = json.loads(md[LINEAGE_JSON_KEY])
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{LINEAGE_JSON_KEY} is not a JSON list of names")
        if ",".join(names) != md[LINEAGE_KEY]:
            raise ValueError(f"{LINEAGE_JSON_KEY} disagrees with {LINEAGE_KEY}")
        lineage = tuple(names)
    else:
        lineage = tuple(md[LINEAGE_KEY].split(","))
    if not lineage or not all(lineage):
        raise ValueError(f"{LINEAGE_KEY} {md[LINEAGE_KEY]!r} names no source")
    return lineage


def resolve_location(location: str, folder: str, real_folder: str) -> str:
    """Absolute path of a payload ``location``; ValueError if it could leave the cache folder.

    Relative, no ``..`` component, and (after resolving symlinks) inside the folder. No stat: a missing
    file is the caller's business (an invalid entry, not a corrupt companion index).
    """
    if not location or "\0" in location:
        raise ValueError(f"payload location {location!r} is empty or contains NUL")
    parts = location.replace("\\", "/").split("/")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise ValueError(f"payload location {location!r} is absolute: it escapes the cache folder")
    if ".." in parts:
        raise ValueError(f"payload location {location!r} escapes the cache folder ('..')")
    path = os.path.join(folder, location)
    real = os.path.realpath(path)
    if real == real_folder or os.path.commonpath([real, real_folder]) != real_folder:
        raise ValueError(f"payload location {location!r} resolves outside the cache folder (symlink)")
    return path


_OWN_DATA = r"\.[0-9a-f]{16}\.data"


def data_file_pattern(root: str) -> re.Pattern[str]:
    """Names of the data files a cache rooted at ``root`` owns (the only ones it ever deletes)."""
    return re.compile(re.escape(root) + _OWN_DATA)


def temp_file_pattern(root: str) -> re.Pattern[str]:
    return re.compile(r"\." + re.escape(root) + r"\.[0-9a-f]{16}\.(data|onnx)\.tmp")
