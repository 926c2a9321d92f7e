"""Reading a sentence-transformers folder's own description of how it embeds (``modules.json``),
so that ``finetune embed`` computes what ``SentenceTransformer(folder).encode`` computes.

Supported pipelines: Transformer → Pooling (``cls``, ``mean``, ``max``, ``mean_sqrt_len_tokens``)
→ optional Normalize. Anything else (Dense layers, other modules) is refused in one line rather
than embedded differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.errors import ModelError

_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
SUPPORTED_POOLING = ("cls", "mean", "max", "mean_sqrt_len_tokens")


@dataclass(frozen=True)
class STConfig:
    transformer_path: str  # folder of the transformer module (the folder itself, or a subfolder)
    pooling: str
    normalize: bool
    max_seq_length: Optional[int]


def _pooling_mode(cfg: dict) -> str:
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for k, m in _LEGACY_MODES.items() if cfg.get(k)]
        mode = modes[0] if len(modes) == 1 else tuple(modes)
    if isinstance(mode, (list, tuple)):
        mode = mode[0] if len(mode) == 1 else "+".join(mode)
    return str(mode)


def folder_json(f: Path, want: type = dict) -> Any:
    """A JSON file of a model folder, which must hold a ``want`` (dict or list); one error line
    naming the folder and the file when it does not parse or holds something else."""
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"cannot load the model in {f.parent}: {f.name} cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"cannot load the model in {f.parent}: {f.name} is not valid JSON ({e.msg} at line "
                         f"{e.lineno}, column {e.colno})") from None
    if not isinstance(data, want):
        kind = {dict: "an object", list: "a list"}[want]
        raise ModelError(f"cannot load the model in {f.parent}: {f.name} must hold {kind}, not "
                         f"{type(data).__name__} {str(data)[:40]}")
    return data


def _modules(root: Path) -> list[dict]:
    modules = folder_json(root / "modules.json", list)
    for i, m in enumerate(modules):
        if not isinstance(m, dict) or not isinstance(m.get("type", ""), str) \
                or not isinstance(m.get("path", ""), str) or not isinstance(m.get("idx", 0), int):
            raise ModelError(f"cannot load the model in {root}: modules.json entry {i} must be an object with a "
                             f"string `type` and `path` and an integer `idx`, not {str(m)[:60]}")
    return sorted(modules, key=lambda m: m.get("idx", 0))


def read_st_config(folder: str | Path) -> Optional[STConfig]:
    """The folder's embedding pipeline, or None when it has no ``modules.json``."""
    root = Path(folder)
    if not (root / "modules.json").is_file():
        return None
    modules = _modules(root)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds \
            or any(k not in ("Transformer", "Pooling", "Normalize") for k in kinds):
        raise ModelError(f"{root} is a sentence-transformers model with modules {' → '.join(kinds)}; finetune embeds "
                         f"Transformer → Pooling [→ Normalize] only: use SentenceTransformer({str(root)!r}).encode")
    tpath = root / modules[0].get("path", "")
    pool_dir = root / modules[kinds.index("Pooling")].get("path", "")
    pcfg = folder_json(pool_dir / "config.json") if (pool_dir / "config.json").is_file() else {}
    mode = _pooling_mode(pcfg)
    if mode not in SUPPORTED_POOLING:
        raise ModelError(f"{root}: sentence-transformers pooling `{mode}` is not supported by finetune embed "
                         f"(supported: {', '.join(SUPPORTED_POOLING)})")
    max_len = None
    for cand in (tpath / "sentence_bert_config.json", root / "sentence_bert_config.json"):
        if cand.is_file():
            max_len = folder_json(cand).get("max_seq_length")
            if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0):
                raise ModelError(f"cannot load the model in {cand.parent}: {cand.name}: `max_seq_length` is "
                                 f"{max_len!r}, not a positive integer")
            break
    return STConfig(str(tpath), mode, "Normalize" in kinds, int(max_len) if max_len else None)
