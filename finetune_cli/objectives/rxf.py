"""R3F and R4F: cross-entropy plus a symmetric-KL smoothness term under input-embedding noise.

Formulation checked against the authors' reference code (fairseq
``examples/rxf/rxf_src/sentence_prediction_r3f.py``):

* The symmetric KL sums ``KL(p‖q) + KL(q‖p)`` over classes and averages over the examples of the
  batch (fairseq: ``F.kl_div(..., "sum") / batch``, later multiplied back by the sample size and
  divided by it with the summed NLL, i.e. ``mean CE + λ · mean_i KL_sym,i``). We use exactly that
  ("batchmean"). PyTorch's default ``"mean"`` reduction would divide by ``N·C`` and silently
  scale λ by ``1/C``.
* Both softmaxes run in float32 and gradients flow through both arguments (no stop-gradient on the
  clean logits).
* The noise is added to a detached copy of the token embeddings (``TextModel`` does this), as
  fairseq does, so the noisy branch trains the encoder layers and heads but not the word-embedding
  table.
* Noise and the KL term exist only in training (``model.training``); an evaluation forward is the
  plain model.

Regression: fairseq's R3F criterion drops the KL term for regression targets and trains plain
MSE, so there is no reference formulation to be faithful to. These objectives declare
``label_type = "class"`` and refuse floating-point labels with a clear error.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from finetune_cli.errors import DataError
from finetune_cli.objectives.base import Objective, check_range
from finetune_cli.objectives.registry import register

NOISE_TYPES = ("uniform", "normal")


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 at least (bf16/fp16 logits under autocast), float64 kept for exact tests."""
    return x if x.dtype == torch.float64 else x.float()


def symmetric_kl(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    r"""Batch mean of ``KL(p‖q) + KL(q‖p)``, ``p = softmax(a)``, ``q = softmax(b)``, in float32.

    .. math:: \mathrm{KL}_S = \frac{1}{N}\sum_i \sum_c (p_{ic} - q_{ic})(\log p_{ic} - \log q_{ic})

    (the two KL terms summed over classes collapse to this form). Symmetric in its arguments,
    zero iff the two distributions agree, gradients through both.
    """
    lp = F.log_softmax(_upcast(logits_a), dim=-1)
    lq = F.log_softmax(_upcast(logits_b), dim=-1)
    # (p - q)(log p - log q) is KL(p‖q) + KL(q‖p) summed over classes: one pass instead of two
    # kl_div calls, same value.
    return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()


def r3f_loss(clean_logits: torch.Tensor, noisy_logits: torch.Tensor, labels: torch.Tensor,
             lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(total, ce, sym_kl)`` with ``total = CE(clean) + lam · KL_S(clean, noisy)``."""
    ce = F.cross_entropy(_upcast(clean_logits), labels)
    kl = symmetric_kl(clean_logits, noisy_logits)
    return ce + lam * kl, ce, kl


@register("r3f")
class R3F(Objective):
    r"""R3F: cross-entropy plus λ times the symmetric KL between clean and noisy predictions.

    .. math:: L = \mathrm{CE}(f(x), y)
              + \lambda\,\mathrm{KL}_S\big(\mathrm{softmax} f(x)\,\|\,\mathrm{softmax} f(x+z)\big),
              \quad z \sim \mathcal{U}(-\varepsilon, \varepsilon)\ \text{or}\ \mathcal{N}(0, \varepsilon^2)

    with z added to the input token embeddings, during training only;
    ``KL_S(p‖q) = KL(p‖q) + KL(q‖p)`` summed over classes and averaged over the batch.

    Paper: Aghajanyan, Shrivastava, Gupta, Goyal, Zettlemoyer, Gupta, "Better Fine-Tuning by
    Reducing Representational Collapse", ICLR 2021 (arXiv 2008.03156). Defaults are the reference
    code's (fairseq ``--eps 1e-5 --r3f-lambda 1.0 --noise-type uniform``).

    Args:
        eps: noise scale ε ≥ 0 (half-width of the uniform, or std of the normal). Default 1e-5.
        lam: weight λ ≥ 0 of the symmetric KL. Default 1.0. λ = 0 is CE plus a wasted forward.
        noise: ``"uniform"`` (default) or ``"normal"``.

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``. Regression labels are
    refused (fairseq trains them with plain MSE, i.e. without the R3F term).

    Relations: ``r4f`` is R3F with a spectrally-normalised classifier; with λ = 0 the loss equals
    ``ce``. Costs one extra forward and backward per step.
    """

    capturable = True
    parts = ("ce", "sym_kl")

    def __init__(self, eps: float = 1e-5, lam: float = 1.0, noise: str = "uniform"):
        super().__init__()
        check_range("eps", eps, ge=0.0)
        check_range("lam", lam, ge=0.0)
        if noise not in NOISE_TYPES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_TYPES)}, got {noise!r}")
        self.eps, self.lam, self.noise = eps, lam, noise

    def forward(self, model, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        labels = batch["labels"]
        if labels.is_floating_point():
            raise DataError(f"objective `{self.name}` needs class labels; regression targets are not supported "
                            "(the reference code drops the R3F term for regression)")
        feats = batch["features"][0]
        if not model.training:
            ce = F.cross_entropy(_upcast(model(feats).logits), labels)
            return {"loss": ce, "ce": ce.detach()}
        # Clean and noisy copies go through the encoder as one batch of 2N rows: the same maths
        # as two passes (no layer mixes rows; dropout masks are drawn per row either way), but
        # half the kernel launches and larger matrix products (measured faster, see notes).
        n = labels.shape[0]
        both = {k: torch.cat([v, v]) for k, v in feats.items()}
        logits = model(both, noise=(self.noise, self.eps, n)).logits
        clean, noisy = logits[:n], logits[n:]
        total, ce, kl = r3f_loss(clean, noisy, labels, self.lam)
        return {"loss": total, "ce": ce.detach(), "sym_kl": kl.detach()}


@register("r4f")
class R4F(R3F):
    r"""R4F: R3F with the classifier's output projection spectrally normalised (1-Lipschitz).

    .. math:: L = \mathrm{CE}(g(f(x)), y)
              + \lambda\,\mathrm{KL}_S\big(g(f(x))\,\|\,g(f(x+z))\big),\quad \sigma_{\max}(W_g) = 1

    The head's weight is divided by its largest singular value, estimated by one power iteration
    per training forward (``torch.nn.utils.parametrizations.spectral_norm``), so the classifier
    cannot amplify the representation change the noise causes.

    Paper: Aghajanyan et al., ICLR 2021 (arXiv 2008.03156), section 3 ("R4F").

    Args:
        eps: noise scale ε ≥ 0. Default 1e-5.
        lam: weight λ ≥ 0 of the symmetric KL. Default 1.0.
        noise: ``"uniform"`` (default) or ``"normal"``.

    Inputs: ``text`` (and optional ``text_pair``) with a class ``label``.

    Relations: ``r3f`` without the spectral norm; the head is saved with its spectral-norm
    parametrisation and reloads as such (``finetune_model.json`` records ``spectral_norm``).
    """

    spectral_norm_head = True
