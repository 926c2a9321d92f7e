"""The settings of ``finetune augment`` and their one-line checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from finetune_cli.augment import DEFAULT_BACKWARD, DEFAULT_FORWARD, AugmentOptionError
from finetune_cli.augment.backtranslate import SamplingSpec
from finetune_cli.augment.edits import EditSpec


@dataclass(frozen=True)
class AugmentConfig:
    """Everything ``finetune augment`` needs; ``settings()`` is what must match for a resume."""

    input: str
    output: str
    columns: tuple[str, ...] = ()
    format: str = "auto"
    header: str = "auto"
    backtranslate: bool = False
    forward_model: str = DEFAULT_FORWARD
    backward_model: str = DEFAULT_BACKWARD
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    edits: EditSpec = field(default_factory=EditSpec)
    num_return: int = 1
    seed: int = 42
    keep_originals: bool = False
    batch_size: int = 32
    chunk_size: int = 1024
    device: str = "auto"

    @property
    def method(self) -> str:
        return "backtranslate" if self.backtranslate else "edit"

    def settings(self, columns: tuple[str, ...]) -> dict[str, Any]:
        s: dict[str, Any] = {"method": self.method, "columns": list(columns), "num_return": self.num_return,
                             "seed": self.seed, "chunk_size": self.chunk_size}
        if self.backtranslate:
            s.update(forward_model=self.forward_model, backward_model=self.backward_model,
                     batch_size=self.batch_size, **dataclasses.asdict(self.sampling))
        else:
            s.update(dataclasses.asdict(self.edits))
        return s


def validate(cfg: AugmentConfig) -> None:
    """Reject bad options with one line, before anything is read or written."""
    e, s = cfg.edits, cfg.sampling
    if cfg.backtranslate and e.active():
        raise AugmentOptionError("choose one method: --backtranslate or the edits (--delete-words, --swap-words, "
                                 "--delete-one-word), not both")
    if not cfg.backtranslate and not e.active():
        raise AugmentOptionError("no augmentation chosen: pass --backtranslate, --delete-words P, --swap-words P "
                                 "or --delete-one-word")
    checks = [
        (s.temperature >= 0, f"--temperature must be >= 0 (0 = beam search); got {s.temperature}"),
        (s.top_k >= 0, f"--top-k must be >= 0 (0 = off); got {s.top_k}"),
        (0 < s.top_p <= 1, f"--top-p must be in (0, 1]; got {s.top_p}"),
        (s.num_beams >= 1, f"--num-beams must be >= 1; got {s.num_beams}"),
        (s.max_length >= 1, f"--max-length must be >= 1; got {s.max_length}"),
        (0 <= e.delete_prob <= 1, f"--delete-words must be a probability in [0, 1]; got {e.delete_prob}"),
        (0 <= e.swap_prob <= 1, f"--swap-words must be a probability in [0, 1]; got {e.swap_prob}"),
        (cfg.num_return >= 1, f"--num-return must be >= 1; got {cfg.num_return}"),
        (cfg.batch_size >= 1, f"--batch-size must be >= 1; got {cfg.batch_size}"),
        (cfg.chunk_size >= 1, f"--chunk-size must be >= 1; got {cfg.chunk_size}"),
        (cfg.header in ("auto", "yes", "no"), f"--header must be auto, yes or no; got {cfg.header}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise AugmentOptionError(msg)
