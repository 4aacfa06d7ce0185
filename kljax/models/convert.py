"""Hugging Face safetensors checkpoint <-> kljax params: a key table plus a generic loader/exporter.

Every row of `RULES` says: this HF key (`{i}` = layer index) is this kljax path, and how the array
changes on the way (`same`, `flat` for a bias [H*Dh] -> [H, Dh], or `linear`: HF's [out, in]
weight is transposed to [in, out] and reshaped to the kljax shape, `in_dims` leading kljax dims
forming `in`). The same table drives import and export, so the two are inverse by construction.

Only safetensors are read: a directory with only `.bin`/`.pt` weights is refused (pickle can run
code), and nothing remote is fetched. The loader checks every key and shape against the config
before reading a byte of weights, then reads one tensor at a time; for a stacked layer parameter it
fills one host buffer [L, ...] and puts it straight onto its target `NamedSharding`, so host memory
peaks at the largest stacked parameter, never the whole model.

Tensors are read with a small memory-mapped reader rather than `safe_open(framework="np")`, which refuses
BF16 checkpoints (numpy has no bfloat16); `ml_dtypes` reads them without torch or an accelerator.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from kljax.errors import UserError, read_json
from kljax.models.config import ModelConfig
from kljax.models.transformer import Params, logical_axes, param_paths, param_shapes
from kljax.parallel import sharding as sharding_lib
from kljax.util.owned_paths import mark, remove_marked

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One HF key <-> one kljax path. kind: 'same' | 'flat' | 'linear' (see the module docstring)."""

    hf: str
    path: tuple[str, ...]
    kind: str = "same"
    in_dims: int = 1

    @property
    def layered(self) -> bool:
        return "{i}" in self.hf

    def pattern(self) -> re.Pattern:
        return re.compile(re.escape(self.hf).replace(r"\{i\}", r"(\d+)") + "$")


_L = "model.layers.{i}."
RULES: tuple[Rule, ...] = (
    Rule("model.embed_tokens.weight", ("embed",)),
    Rule("model.norm.weight", ("final_norm",)),
    Rule("lm_head.weight", ("lm_head",), "linear"),
    Rule(_L + "input_layernorm.weight", ("layers", "attn_norm")),
    Rule(_L + "self_attn.q_proj.weight", ("layers", "q"), "linear"),
    Rule(_L + "self_attn.k_proj.weight", ("layers", "k"), "linear"),
    Rule(_L + "self_attn.v_proj.weight", ("layers", "v"), "linear"),
    Rule(_L + "self_attn.o_proj.weight", ("layers", "o"), "linear", in_dims=2),
    Rule(_L + "self_attn.q_proj.bias", ("layers", "q_bias"), "flat"),
    Rule(_L + "self_attn.k_proj.bias", ("layers", "k_bias"), "flat"),
    Rule(_L + "self_attn.v_proj.bias", ("layers", "v_bias"), "flat"),
    Rule(_L + "self_attn.o_proj.bias", ("layers", "o_bias")),
    Rule(_L + "self_attn.q_norm.weight", ("layers", "q_norm")),
    Rule(_L + "self_attn.k_norm.weight", ("layers", "k_norm")),
    Rule(_L + "post_attention_layernorm.weight", ("layers", "mlp_norm")),
    Rule(_L + "mlp.gate_proj.weight", ("layers", "gate"), "linear"),
    Rule(_L + "mlp.up_proj.weight", ("layers", "up"), "linear"),
    Rule(_L + "mlp.down_proj.weight", ("layers", "down"), "linear"),
)
# Keys that may be present and are not parameters (old RoPE buffers).
IGNORED_KEYS = (re.compile(r".*rotary_emb\.inv_freq$"),)


def hf_shape(rule: Rule, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF tensor shape for a kljax (per-layer) parameter of `shape`."""
    if rule.kind == "linear":
        return (math.prod(shape[rule.in_dims:]), math.prod(shape[: rule.in_dims]))
    if rule.kind == "flat":
        return (math.prod(shape),)
    return tuple(shape)


def to_kljax(rule: Rule, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """HF tensor -> kljax (per-layer) array of `shape`."""
    return (array.T if rule.kind == "linear" else array).reshape(shape)


def to_hf(rule: Rule, array: np.ndarray) -> np.ndarray:
    """kljax (per-layer) array -> HF tensor (inverse of `to_kljax`)."""
    if rule.kind == "linear":
        inner = math.prod(array.shape[: rule.in_dims])
        return np.ascontiguousarray(array.reshape(inner, -1).T)
    return array.reshape(hf_shape(rule, array.shape))


# ---------------------------------------------------------------------------------- safetensors


class SafetensorsFile:
    """Header of one .safetensors file, and memory-mapped reads of its tensors."""

    def __init__(self, path: Path):
        """Read and check the header: a UserError naming the file (and tensor) when it is empty,
        truncated, not safetensors, or its tensors' offsets, dtypes or shapes do not add up."""
        self.path = Path(path)
        file_size = self.path.stat().st_size
        bad = f"{self.path} is not a valid safetensors file"
        if file_size < 8:
            raise UserError(f"{bad}: {file_size} bytes, too short for a header (empty or truncated)")
        with open(self.path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size > file_size - 8:
                raise UserError(
                    f"{bad}: its header claims {size} bytes but the file has {file_size} (garbage or truncated)"
                )
            try:
                header = json.loads(f.read(size))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"{bad}: its header is not JSON ({e})") from e
        if not isinstance(header, dict):
            raise UserError(f"{bad}: its header is not a JSON object")
        header.pop("__metadata__", None)
        self.header: dict[str, dict[str, Any]] = header
        self.data_start = 8 + size
        for key, info in header.items():
            self._check_entry(key, info, file_size - self.data_start)

    def _check_entry(self, key: str, info: Any, data_size: int) -> None:
        where = f"tensor {key!r} in {self.path}"
        try:
            dtype, shape, (begin, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise UserError(f"{where}: malformed header entry {info!r}") from e
        if dtype not in _DTYPES:
            raise UserError(f"{where} has unsupported dtype {dtype!r}; supported: {sorted(_DTYPES)}")
        nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
        if not (isinstance(begin, int) and isinstance(end, int)) or min(shape, default=0) < 0 or end - begin != nbytes:
            raise UserError(f"{where}: data offsets {[begin, end]} do not hold a {dtype} tensor of shape {shape}")
        if begin < 0 or end > data_size:
            raise UserError(
                f"{where}: its data ends at byte {end} but the file holds {data_size} bytes of data (truncated)"
            )

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.header[key]["shape"])

    def get(self, key: str) -> np.ndarray:
        info = self.header[key]
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"tensor {key} in {self.path} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        if end == begin:
            return np.zeros(info["shape"], dtype)
        data = np.memmap(self.path, np.uint8, "r", offset=self.data_start + begin, shape=(end - begin,))
        return data.view(dtype).reshape(info["shape"])


def read_hf_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The `config.json` dict of a checkpoint directory (UserError when absent or not a JSON object)."""
    if not Path(model_dir).is_dir():
        raise UserError(f"model directory {model_dir} does not exist (or is not a directory)")
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{model_dir} has no config.json; expected a Hugging Face checkpoint directory")
    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise UserError(f"config file {path} holds a {type(config).__name__}, not a JSON object")
    return config


def model_config_from_dir(model_dir: str | os.PathLike, **overrides: Any) -> ModelConfig:
    """`ModelConfig.from_hf` of the directory's config.json, its errors naming the file."""
    try:
        return ModelConfig.from_hf(read_hf_config(model_dir), **overrides)
    except UserError:
        raise
    except (ValueError, TypeError) as e:
        raise UserError(f"{Path(model_dir) / 'config.json'}: {e}") from e


def check_hf_dir(model_dir: str | os.PathLike, **overrides: Any) -> ModelConfig:
    """Config, file layout, tensor names and shapes of a HF checkpoint directory, checked without
    reading any weights (a UserError naming the file and tensor); returns its ModelConfig."""
    config = model_config_from_dir(model_dir, **overrides)
    validate_checkpoint(open_checkpoint(model_dir), config)
    return config


def open_checkpoint(model_dir: str | os.PathLike) -> dict[str, SafetensorsFile]:
    """HF key -> the safetensors file holding it, read as transformers reads a directory:
    `model.safetensors`, or the files `model.safetensors.index.json` names, and no other file (a
    backup `*.safetensors` beside them is ignored). A tensor in two files is an error, as is a
    tensor the index places in another file than the one holding it."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    weight_map: dict[str, str] | None = None
    if index.is_file():
        data = read_json(index, "checkpoint index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UserError(f"{index} has no weight_map of tensor name -> file name")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise UserError(f"{index} names shard files that do not exist: {missing}")
        files = [model_dir / n for n in names]
    else:
        files = [model_dir / "model.safetensors"] if (model_dir / "model.safetensors").is_file() else []
    if not files:
        others = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if others:
            raise UserError(
                f"{model_dir} has neither model.safetensors nor model.safetensors.index.json (found "
                f"{', '.join(others)}; transformers would not read them either)"
            )
        pickled = sorted(p.name for ext in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in model_dir.glob(ext))
        if pickled:
            raise ValueError(
                f"{model_dir} has only pickle weights ({', '.join(pickled)}); kljax reads only .safetensors "
                "because unpickling can run arbitrary code. Convert them to safetensors first."
            )
        raise UserError(f"{model_dir} has no model.safetensors (nor model.safetensors.index.json)")
    by_key: dict[str, SafetensorsFile] = {}
    for path in files:
        st = SafetensorsFile(path)
        for key in st.keys():
            if key in by_key:
                raise UserError(f"tensor {key!r} is in both {by_key[key].path} and {path}")
            if weight_map is not None and weight_map.get(key, path.name) != path.name:
                raise UserError(f"tensor {key!r} is in {path} but {index} places it in {weight_map[key]}")
            by_key[key] = st
    return by_key


def _rules_for(config: ModelConfig) -> list[tuple[Rule, tuple[int, ...]]]:
    """(rule, per-layer kljax shape) for every parameter of `config`."""
    by_path = {r.path: r for r in RULES}
    out = []
    for path, shape in param_paths(config).items():
        rule = by_path[path]
        out.append((rule, shape[1:] if rule.layered else shape))
    return out


def _hf_keys(rule: Rule, config: ModelConfig) -> list[str]:
    return [rule.hf.format(i=i) for i in range(config.num_layers)] if rule.layered else [rule.hf]


def validate_checkpoint(files: Mapping[str, SafetensorsFile], config: ModelConfig) -> None:
    """Raise ValueError naming missing, unexpected or mis-shaped tensors."""
    expected: dict[str, tuple[int, ...]] = {}
    for rule, shape in _rules_for(config):
        for key in _hf_keys(rule, config):
            expected[key] = hf_shape(rule, shape)
    where = next(iter(files.values())).path.parent if files else "checkpoint"
    missing = [k for k in expected if k not in files]
    if missing:
        raise UserError(
            f"checkpoint {where} is missing {len(missing)} tensor(s) that {config.architecture} with this "
            "config.json "
            f"needs: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"
        )
    # Tied models may still store the head (a copy of the embedding); it is not read.
    tied_head = {"lm_head.weight"} if config.tie_embeddings else set()
    extra = [
        k for k in files
        if k not in expected and k not in tied_head and not any(p.match(k) for p in IGNORED_KEYS)
    ]
    if extra:
        raise UserError(
            f"checkpoint {where} has {len(extra)} unexpected tensor(s) for {config.architecture} with this "
            "config.json: "
            f"{', '.join(sorted(extra)[:8])}{' ...' if len(extra) > 8 else ''}"
        )
    for key, shape in expected.items():
        found = files[key].shape(key)
        if found != shape:
            raise UserError(
                f"tensor {key}: expected shape {shape} from config.json, found {found} (in {files[key].path})"
            )


def check_vocab(config: ModelConfig, tokenizer_size: int) -> None:
    """Raise ValueError if the tokenizer has ids beyond the embedding (a padded embedding is fine)."""
    if tokenizer_size > config.vocab_size:
        raise ValueError(
            f"vocab size mismatch: the tokenizer has {tokenizer_size} tokens but the model's embedding has "
            f"vocab_size={config.vocab_size} rows"
        )


def _finite(st: SafetensorsFile, key: str) -> np.ndarray:
    """Tensor `key` of `st`; a UserError naming it when any element is inf or NaN."""
    array = st.get(key)
    if array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16:
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise UserError(f"tensor {key} in {st.path} has {bad} non-finite value(s) (inf or NaN)")
    return array


def load_hf_checkpoint(
    model_dir: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
    **overrides: Any,
) -> tuple[Params, ModelConfig]:
    """Read a HF checkpoint directory into (params, config).

    `overrides` set run-time config fields (param_dtype, dtype, scan_layers, remat). With a `mesh`,
    each parameter goes straight to its NamedSharding from `kljax.parallel.sharding.LOGICAL_RULES`.
    """
    config = model_config_from_dir(model_dir, **overrides)
    files = open_checkpoint(model_dir)
    validate_checkpoint(files, config)
    for rule, _ in _rules_for(config):  # every tensor finite before any is placed on a device
        for key in _hf_keys(rule, config):
            _finite(files[key], key)
    shardings = None
    if mesh is not None:
        shardings = sharding_lib.logical_to_sharding(logical_axes(config), param_shapes(config), mesh)
    dtype = np.dtype(config.jnp_param_dtype)
    flat: dict[tuple[str, ...], jax.Array] = {}
    for rule, shape in _rules_for(config):
        keys = _hf_keys(rule, config)
        if rule.layered:
            host = np.empty((len(keys), *shape), dtype)
            for i, key in enumerate(keys):
                host[i] = to_kljax(rule, files[key].get(key), shape)
        else:
            host = np.asarray(to_kljax(rule, files[keys[0]].get(keys[0]), shape), dtype)
        if shardings is None:
            flat[rule.path] = jax.device_put(host)
        else:
            node = shardings
            for k in rule.path:
                node = node[k]
            flat[rule.path] = sharding_lib.device_put_host(host, node)
        del host
    params: Params = {}
    for path, value in flat.items():
        node = params
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    return params, config


def _host(array: Any) -> np.ndarray:
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        from jax.experimental import multihost_utils

        array = multihost_utils.process_allgather(array, tiled=True)
    return np.asarray(jax.device_get(array))


def export_hf(
    params: Params,
    config: ModelConfig,
    out_dir: str | os.PathLike,
    *,
    hf_config: Mapping[str, Any] | None = None,
    dtype: str | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = 4 << 30,
    overwrite: bool = False,
) -> Path:
    """Write params as a HF checkpoint (config.json + safetensors, sharded with an index if large).

    `hf_config`: the original config.json to keep (it must describe the same architecture);
    otherwise one is generated. `dtype` defaults to `config.param_dtype`. Tokenizer files found in
    `tokenizer_dir` are copied. Written to a temp dir and renamed, so a crash leaves no half output.
    With several processes, all must call this (arrays are gathered); process 0 writes.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ValueError(f"{out_dir} exists and is not empty (pass overwrite=True to replace it)")
    dtype = dtype or config.param_dtype
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if hf_config is not None:
        arch_fields = {f.name for f in dataclasses.fields(ModelConfig)} - {
            "param_dtype", "dtype", "scan_layers", "remat", "kernels"
        }
        theirs = ModelConfig.from_hf(hf_config)
        diff = [f for f in arch_fields if getattr(theirs, f) != getattr(config, f)]
        if diff:
            raise ValueError(f"hf_config does not describe this model; fields differ: {sorted(diff)}")
        config_json = {**hf_config, "torch_dtype": dtype}
        config_json.pop("quantization_config", None)
        if "dtype" in config_json:
            config_json["dtype"] = dtype
    else:
        config_json = config.to_hf(dtype)

    tensors: dict[str, np.ndarray] = {}
    for rule, _ in _rules_for(config):
        node = params
        for k in rule.path:
            node = node[k]
        stacked = _host(node)
        for i, key in enumerate(_hf_keys(rule, config)):
            tensors[key] = to_hf(rule, stacked[i] if rule.layered else stacked).astype(np_dtype)
    if jax.process_index() != 0:
        return out_dir

    from safetensors.numpy import save_file

    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, array in tensors.items():
        if size and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = array
        size += array.nbytes
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        weight_map = {}
        for n, shard in enumerate(shards):
            name = (
                "model.safetensors" if len(shards) == 1
                else f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
            )
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        if len(shards) > 1:
            total = sum(a.nbytes for a in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)

        mark(tmp, "kljax.models.convert.export_hf")
        if out_dir.is_symlink() or (out_dir.exists() and any(out_dir.iterdir())):
            remove_marked(out_dir, "overwrite of")  # only an earlier export_hf output (or an empty directory)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
