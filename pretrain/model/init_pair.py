"""`--init_from` for a replaced-token-detection run: the two networks' tensors under the pair's
names (``discriminator.*``, ``generator.*``).

The discriminator comes from ``--init_from`` (an ELECTRA discriminator folder as transformers
writes it, a BERT folder, whose encoder is the same, or one of our runs); the generator from
``--generator_from``, else the ``generator/`` folder our export writes inside the
discriminator's, else it starts anew. Which names hold the vocabulary rows and which are tied is
the model's ``init_adapter`` (:mod:`pretrain.model.init_from` loads through it).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from bertforge.pretrain.model.init_source import InitError, InitSource, read_hf_weights
from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

NETWORKS = ("discriminator", "generator")


def pair_key(key: str, network: str) -> str:
    """A transformers key of an ELECTRA (or BERT) folder under the pair's name for ``network``;
    our own run's pair names stay as they are."""
    k = key
    while k.startswith(("model.", "module.")):
        k = k.split(".", 1)[1]
    if k.startswith(tuple(f"{n}." for n in NETWORKS)):
        return k
    if k.startswith(("embeddings.", "encoder.", "pooler.")):
        k = "electra." + k
    elif k.startswith("bert."):  # a BERT encoder is ELECTRA's under another name
        k = "electra." + k[len("bert.") :]
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
    k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
    return f"{network}.{k}"


def generator_folder(src: InitSource, generator_from: str) -> Path | None:
    """The generator's folder: ``--generator_from``, else our export's ``generator/`` beside the
    discriminator's weights, else None (the generator starts anew)."""
    if generator_from:
        folder = Path(generator_from)
        if not (folder / "config.json").is_file():
            raise InitError(
                f"--generator_from {folder}: no config.json there (give an ElectraForMaskedLM "
                "folder as transformers writes it)"
            )
        return folder
    inside = src.path / "generator"
    return inside if src.kind == "hf" and (inside / "config.json").is_file() else None


def pair_state_dict(
    src: InitSource, generator_from: str
) -> tuple[dict[str, torch.Tensor], Path, Path | None]:
    """(the pair's tensors, the discriminator's file, the generator's folder or None)."""
    if src.kind == "run":
        sd, file = consolidated_state_dict(src.checkpoint), src.checkpoint
    else:
        sd, file = read_hf_weights(src.checkpoint)
    out = {pair_key(k, "discriminator"): v for k, v in sd.items()}
    gen = generator_folder(src, generator_from)
    if gen is not None:
        gen_sd, _ = read_hf_weights(gen)
        out.update({pair_key(k, "generator"): v for k, v in gen_sd.items()})
    return out, file, gen
