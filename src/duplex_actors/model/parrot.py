"""The parrot LM: a tiny Moshi-architecture LM whose agent codes copy the user's, one frame late.

End-to-end tests use it to prove that every session gets back exactly its own audio codes.
Its weights are set in closed form (deterministically, instantly) rather than learnt, so the
copy is exact for every code:

- the user codebook ``k`` embeds into its own 32-dim subspace ``k`` of the 256-dim stream, as
  a random unit vector per code; every other stream (text, agent codes) embeds to zero;
- every transformer and depformer layer has zero weights, so each is the identity through
  its residual connection;
- depformer step ``k`` reads subspace ``k`` and scores each code by its dot product with
  the code's vector (largest for the code itself: codewords are checked to be distinct).

In moshi's delayed layout the input at position ``t`` holds user codebook 0 of frame ``t``
and codebooks 1..7 of frame ``t-1``; step ``t`` predicts agent codebook 0 of frame ``t+1``
and codebooks 1..7 of frame ``t``. So agent frame ``t+1`` equals user frame ``t``: a delay
of exactly one frame on every codebook. Text logits are all zero (greedy text id 0, EPAD).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .engine import NUM_CODEBOOKS

if TYPE_CHECKING:
    from moshi.models.lm import LMModel

PARROT_DELAY_FRAMES = 1
SUBSPACE = 32
CARD = 2048
PARROT_LM: dict[str, Any] = {
    "dim": SUBSPACE * NUM_CODEBOOKS,
    "text_card": 256,
    "num_heads": 4,
    "num_layers": 1,
    "hidden_scale": 2.0,
    "context": 250,
    "card": CARD,
    "depformer_dim": SUBSPACE,
    "depformer_dim_feedforward": 64,
    "depformer_num_heads": 2,
    "depformer_num_layers": 1,
}
_LOGIT_SCALE = 64.0
_MAX_COSINE = 0.9


def _codewords(gen: torch.Generator) -> torch.Tensor:
    raw = torch.randn(NUM_CODEBOOKS, CARD, SUBSPACE, generator=gen)
    words: torch.Tensor = raw / raw.norm(dim=-1, keepdim=True)
    gram = words @ words.transpose(1, 2) - 2 * torch.eye(CARD)
    worst = float(gram.max())
    if worst > _MAX_COSINE:  # would make two codes hard to tell apart
        raise RuntimeError(f"parrot codewords too close (cosine {worst:.3f}); change the seed")
    return words


@torch.no_grad()
def build_parrot_lm(seed: int = 0) -> LMModel:
    from moshi.models import loaders

    kwargs = dict(loaders._lm_kwargs)
    kwargs.update(PARROT_LM, dep_q=NUM_CODEBOOKS, depformer_context=NUM_CODEBOOKS)
    lm: Any = loaders.get_moshi_lm(None, lm_kwargs=kwargs, dtype=torch.float32)
    words = _codewords(torch.Generator().manual_seed(seed + 7))
    for p in lm.parameters():
        p.zero_()
    for name, p in lm.named_parameters():
        if name.endswith("alpha"):  # RMSNorm gains: 1 outside the (zeroed) layers
            if not (name.startswith("transformer.layers") or name.startswith("depformer.layers")):
                p.fill_(1.0)
    n_agent = NUM_CODEBOOKS
    for k in range(NUM_CODEBOOKS):
        rows = slice(k * SUBSPACE, (k + 1) * SUBSPACE)
        # User codebook k is audio stream n_agent + k; its start token (row CARD) stays zero.
        lm.emb[n_agent + k].weight[:CARD, rows] = words[k]
        lm.depformer_in[k].weight[:, rows] = torch.eye(SUBSPACE)
        lm.linears[k].weight[:] = words[k] * _LOGIT_SCALE
    built: LMModel = lm
    return built
