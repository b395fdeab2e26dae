"""Lazy, strict checkpoint loading.

Sources expose tensor names and shapes without reading data, so a config can be derived
and a checkpoint validated before any weight is materialised, and big models are read one
tensor at a time:

- `.pth` / `.bin`: `torch.load(weights_only=True, mmap=True)` (tensors stay on disk);
- safetensors, single or sharded (`model.safetensors.index.json`), opened with `safe_open`.

Architecture files describe what they expect (name -> shape) and how a source's names map
to their canonical names; `check_strict` compares and reports every problem in one error.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from ssmport.errors import CheckpointError

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
}


def storage_key(t: torch.Tensor) -> int:
    """The identity of a tensor's storage: the same for every view and detached alias of it,
    and stable when the storage is resized."""
    return t.untyped_storage()._cdata


class TensorSource(Mapping[str, torch.Tensor]):
    """Read-only name -> tensor mapping that can report shapes without loading data.

    `source[name]` reads (and, for views, transforms) one tensor; `shape` and `dtype` never
    read data. `origin` names where the tensors come from, for error messages.
    """

    origin: str
    # Tensors of the checkpoint the loader left out on purpose, by name prefix:
    # {prefix: (what they are, how many)} (a VLM's vision tower); the user is told.
    skipped: Mapping[str, tuple[str, int]] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape `self[name]` will have, without reading it."""
        raise NotImplementedError

    def dtype(self, name: str) -> torch.dtype:
        """The stored dtype of `name`, without reading it."""
        raise NotImplementedError

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, by name."""
        return {name: self.shape(name) for name in self}

    def release_pages(self) -> None:
        """Let go of the memory-mapped file pages reading has made resident (they count in
        this process's RSS until then). Tensors already read stay valid. Default: nothing."""

    def storage_keys(self) -> frozenset[int]:
        """The storages of tensors this source keeps (`storage_key`): what a consumer must
        never free. Default: none (every read makes a new tensor)."""
        return frozenset()


class DictSource(TensorSource):
    """In-memory tensors (synthetic weights, tests)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], origin: str = "<memory>"):
        self.origin = origin
        self._tensors = dict(tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self._tensors[name].dtype

    def storage_keys(self) -> frozenset[int]:
        return frozenset(storage_key(t) for t in self._tensors.values())


class GeneratedSource(TensorSource):
    """Deterministic synthetic tensors, each generated on first access from (seed, name).

    `init(name, shape, generator)` makes one tensor; values do not depend on the order of
    access, and a multi-GB model never has to exist in memory at once.
    """

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        seed: int,
        init: Callable[[str, tuple[int, ...], torch.Generator], torch.Tensor],
    ):
        self.origin = f"<synthetic seed={seed}>"
        self._shapes, self._seed, self._init = dict(shapes), seed, init

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = self._shapes[name]
        g = torch.Generator().manual_seed(self._seed * 1_000_003 + zlib.crc32(name.encode()))
        return self._init(name, shape, g).float()

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32


class PthSource(DictSource):
    """A flat `{name: tensor}` pickle (BlinkDL `.pth`, HF `pytorch_model.bin`), memory-mapped."""

    def __init__(self, paths: list[Path]):
        self._paths = list(paths)
        tensors: dict[str, torch.Tensor] = {}
        for path in paths:
            for name, tensor in _torch_load(path).items():
                if name in tensors:
                    raise CheckpointError(f"{path}: tensor {name!r} appears in more than one shard")
                tensors[name] = tensor
        super().__init__(tensors, origin=str(paths[0]) if len(paths) == 1 else str(paths[0].parent))

    def release_pages(self) -> None:
        release_mapped_pages(self._paths)


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            # Legacy (non-zip) pickles cannot be memory-mapped; read them whole.
            if "mmap" not in str(exc):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    # What torch.load raises on a file that is not a checkpoint (a text file: KeyError on its
    # "magic number"; a cut one: EOFError, struct.error, ...).
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError,
            TypeError, struct.error) as exc:  # fmt: skip
        raise CheckpointError(f"{path}: not a loadable PyTorch checkpoint ({_load_failure(path, exc)})") from None
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise CheckpointError(f"{path}: expected a flat {{name: tensor}} state dict")
    return obj


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _load_failure(path: Path, exc: BaseException) -> str:
    """Why torch.load refused `path`, in ssmport's words: torch's own text carries terminal
    escapes and the advice to retry with weights_only=False, unsafe (it runs the pickle's code)
    and wrong for a file that is not a pickle at all."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        head = b""
    if head[:2] == b"\x1f\x8b":
        return "it is a gzip file; decompress it first"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 27:
        return "it is a safetensors file; give its Hugging Face folder (with config.json)"
    text = _ANSI.sub("", str(exc)).strip()
    if "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        return ("it holds Python objects besides tensors" + (f" ({found.group(1)})" if found else "")
                + ", which ssmport does not unpickle (a pickle can run code)")  # fmt: skip
    if isinstance(exc, (KeyError, TypeError, struct.error)) or not text:  # their messages mean nothing here
        return "unrecognised file format"
    return text.splitlines()[0]


class SafetensorsSource(TensorSource):
    """One or more safetensors files, opened lazily (each tensor read on access)."""

    def __init__(self, paths: list[Path]):
        from safetensors import safe_open

        self.origin = str(paths[0]) if len(paths) == 1 else str(paths[0].parent)
        self._paths = list(paths)
        self._handles = []
        self._where: dict[str, object] = {}
        for path in paths:
            try:
                handle = safe_open(str(path), framework="pt")
            except FileNotFoundError:
                raise CheckpointError(f"{path}: no such file") from None
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
            self._handles.append(handle)
            for name in handle.keys():
                if name in self._where:
                    raise CheckpointError(f"{path}: tensor {name!r} appears in more than one shard")
                self._where[name] = handle

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def release_pages(self) -> None:
        release_mapped_pages(self._paths)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        code = self._where[name].get_slice(name).get_dtype()
        if code not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self.origin}: tensor {name!r} has unsupported dtype {code}")
        return _SAFETENSORS_DTYPES[code]


def open_pth(path: Path) -> TensorSource:
    return PthSource([path])


# A Hugging Face folder's weights, in the order they are looked for: (shard index, single file).
HF_WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
)


MAX_INDEX_BYTES = 64 << 20  # a shard index lists names only; the largest are a few MB


def read_shard_index(index: Path) -> dict[str, str]:
    """A `*.index.json`'s weight_map (tensor name -> shard file), checked: an object of
    names to plain file names in the same folder (never a path out of it)."""
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{index.stat().st_size:,} bytes")
        data = json.loads(index.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{index}: not a readable shard index ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: not a valid shard index (no weight_map object naming the shards)")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or shard in (".", "..") or "/" in shard or "\\" in shard:
            raise CheckpointError(f"{index}: weight_map gives tensor {name!r} the shard {shard!r}, "
                                  "which is not a file name in this folder")  # fmt: skip
    return weight_map


def shard_names(index: Path) -> list[str]:
    """The shard files a `*.index.json` lists, sorted."""
    return sorted(set(read_shard_index(index).values()))


def _check_index_matches(index: Path, source: TensorSource, weight_map: dict[str, str]) -> None:
    """The index must describe the shards: a tensor it lists that no shard holds (or the
    reverse) means shards from another checkpoint, or a stale index."""
    present = set(source)
    listed = set(weight_map)
    problems = []
    if listed - present:
        problems.append(f"lists {len(listed - present)} tensor(s) no shard holds ({', '.join(sorted(listed - present)[:3])})")
    if present - listed:
        problems.append(f"does not list {len(present - listed)} tensor(s) the shards hold "
                        f"({', '.join(sorted(present - listed)[:3])})")  # fmt: skip
    if problems:
        raise CheckpointError(f"{index}: the shard index does not match its shards: {'; '.join(problems)}")


def open_hf_weights(folder: Path) -> TensorSource:
    """The weights of a Hugging Face model folder, sharded or not."""
    for (index_name, single_name), cls in zip(HF_WEIGHT_FILES, (SafetensorsSource, PthSource)):
        index = folder / index_name
        if index.is_file():
            weight_map = read_shard_index(index)
            shards = [folder / shard for shard in sorted(set(weight_map.values()))]
            missing = [s.name for s in shards if not s.is_file()]
            if missing:
                raise CheckpointError(f"{folder}: shard(s) listed in {index_name} are missing: {', '.join(missing)}")
            source = cls(shards)
            _check_index_matches(index, source, weight_map)
            return source
        if (folder / single_name).is_file():
            return cls([folder / single_name])
    raise CheckpointError(
        f"{folder}: no weights found (expected model.safetensors[.index.json] or pytorch_model.bin)"
    )


class MappedSource(TensorSource):
    """A canonical-name view of another source: `canonical -> (source name, transform)`.

    Transforms (transpose, squeeze, dtype cast) run only when a tensor is read.
    """

    def __init__(
        self,
        source: TensorSource,
        mapping: Mapping[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]],
        shapes: Mapping[str, tuple[int, ...]],
        skipped: Mapping[str, tuple[str, int]] | None = None,
    ):
        """`skipped`: the source's tensors deliberately not mapped, {prefix: (what, count)}."""
        self.origin = source.origin
        self._source = source
        self._mapping = dict(mapping)
        self._shapes = dict(shapes)
        self.skipped = dict(skipped or {})

    def __getitem__(self, name: str) -> torch.Tensor:
        source_name, transform = self._mapping[name]
        tensor = transform(self._source[source_name])
        # Refused rather than warned about: a NaN/Inf weight makes every output NaN.
        # (a meta tensor, the gate's layer-streamed reference tracing a build, has no values)
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{self.origin}: tensor {source_name} contains NaN or Inf values")
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping)

    def __len__(self) -> int:
        return len(self._mapping)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        return self._source.dtype(self._mapping[name][0])

    def release_pages(self) -> None:
        self._source.release_pages()

    def storage_keys(self) -> frozenset[int]:
        return self._source.storage_keys()


_MADV_DONTNEED = 4  # the same value on Linux and macOS


def release_mapped_pages(paths: list[Path]) -> None:
    """madvise(MADV_DONTNEED) over this process's mappings of `paths` (Linux: found in
    /proc/self/maps; elsewhere nothing). torch.load(mmap=True) and safetensors map checkpoint
    files and hand out views; every page read stays resident, so a 15 GB checkpoint read once
    would sit in RSS for the rest of the export. The pages are file-backed and never written:
    dropping them loses nothing, and a later read of a tensor faults them back from the file."""
    import ctypes

    wanted = {str(Path(p).resolve()) for p in paths}
    try:
        with open("/proc/self/maps") as f:
            ranges = [line.split()[0] for line in f if line.rstrip("\n").split(maxsplit=5)[-1] in wanted]
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    for span in ranges:
        start, end = (int(x, 16) for x in span.split("-"))
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)


_LISTED = 12  # names shown per kind of problem; a layer count gone wrong can make thousands


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names) - _LISTED} more)" if len(names) > _LISTED else "")


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_strict(
    source: TensorSource,
    expected: Mapping[str, tuple[int, ...]],
    optional: frozenset[str] = frozenset(),
    what: str = "checkpoint",
) -> None:
    """Raise one `CheckpointError` naming every missing, unexpected and misshaped tensor.

    `optional` names tensors that may be absent (if present they must have the expected
    shape); anything not in `expected` is unexpected.
    """
    present = set(source)
    missing = [n for n in expected if n not in present and n not in optional]
    unexpected = sorted(present - set(expected))
    misshaped = [
        f"{n} {list(source.shape(n))} (expected {list(expected[n])})"
        for n in expected
        if n in present and source.shape(n) != tuple(expected[n])
    ]
    wrong_dtype = [
        f"{n} {str(source.dtype(n)).removeprefix('torch.')}"
        for n in expected
        if n in present and source.dtype(n) not in FLOAT_DTYPES
    ]
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped),
                         ("not floating point", wrong_dtype)):  # fmt: skip
        if names:
            problems.append(f"{label} {len(names)}: {_listing(names)}")
    if problems:
        raise CheckpointError(f"{source.origin}: does not match {what}: " + "; ".join(problems))
