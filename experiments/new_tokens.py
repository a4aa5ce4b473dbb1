"""The new-token half of the continued-pretraining benchmark: a base folder whose new vocabulary
rows are random (the arm mean-of-pieces is compared with), and the loss on validation positions
whose label is a new token, one evaluator on the same fixed masks for every model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from bertforge.files import publish_dir, write_json_atomic
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.logs import get_logger

# __spec__.name, not __name__: run with `python -m`, this module's __name__ is "__main__"
log = get_logger(__spec__.name)

if TYPE_CHECKING:
    from experiments.continued import Bench

ARMS = ("scratch", "continued", "random_rows")
VOCAB_KEYS = (  # tensors with one row (or entry) per vocabulary token in an exported folder
    "bert.embeddings.word_embeddings.weight",
    "embeddings.word_embeddings.weight",  # a published BertModel (no MLM head, no prefix)
    "cls.predictions.decoder.weight",
)
BIAS_KEYS = ("cls.predictions.bias", "cls.predictions.decoder.bias")


def random_rows_folder(base: Path, ext_tokenizer: Path, out: Path, seed: int = 0) -> Path:
    """`base` with one row per extended-tokenizer entry: old tokens' rows as they are, new
    tokens' rows random (normal(0, initializer_range); MLM bias 0), whether a new token took an
    ``[unused*]`` slot or was appended, and the extended tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    if (out / "model.safetensors").is_file():
        return out
    config = json.loads((base / "config.json").read_text())
    sd = load_file(str(base / "model.safetensors"))
    old_vocab = AutoTokenizer.from_pretrained(str(base)).get_vocab()
    tok = AutoTokenizer.from_pretrained(str(ext_tokenizer))
    old_ids = {i: t for t, i in old_vocab.items()}
    new_ids = sorted(i for t, i in tok.get_vocab().items() if old_ids.get(i) != t)
    old, new = config["vocab_size"], len(tok)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(len(new_ids), config["hidden_size"], generator=gen)
    rows = rows * config.get("initializer_range", 0.02)
    for key in (*VOCAB_KEYS, *BIAS_KEYS):
        if key not in sd:
            continue
        t = sd[key]
        grown = torch.cat([t, t.new_zeros((new - old, *t.shape[1:]))]) if new > old else t.clone()
        index = torch.tensor(new_ids)
        grown[index] = rows.to(t.dtype) if key in VOCAB_KEYS else 0.0
        sd[key] = grown.contiguous()
    with publish_dir(out, replace=True) as tmp:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json_atomic(tmp / "config.json", {**config, "vocab_size": new}, indent=2)
        tok.save_pretrained(str(tmp))
    return out


def export_arms(b: Bench) -> dict[str, dict[str, Path]]:
    """HF folders of every arm's lr-0 run (step 0) and final checkpoint (`pretrain.export`)."""
    from bertforge.pretrain.export.hf_export import export

    folders: dict[str, dict[str, Path]] = {}
    for arm in ARMS:
        for when, run in (("step0", f"{arm}_step0"), ("final", arm)):
            out = b.out / "hf" / run
            export(b.out / "runs" / run, out, verify=False)
            folders.setdefault(arm, {})[when] = out
    return folders


def validation_batches(shards: Path, run: Path, passes: int, micro_batch_size: int) -> list:
    """`passes` fixed-mask passes over the validation split with the run's masking settings
    (config.json); pass k uses masking seed run_seed + k, so pass 0 has the trainer's masks."""
    from bertforge.data_prep.reader import ShardReader
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import MaskingConfig

    masking = json.loads((run / "config.json").read_text())["masking"]
    reader = ShardReader(shards, "validation")
    batches = []
    for k in range(passes):
        cfg = MaskingConfig(**{**masking, "seed": masking["seed"] + k})
        loader = build_loader(
            reader,
            DataConfig(num_workers=0),
            cfg,
            micro_batch_size=micro_batch_size,
            train=False,
        )
        for batch in loader:
            batches.append(
                (
                    k,
                    {
                        key: batch[key]
                        for key in ("input_ids", "attention_mask", "token_type_ids", "labels")
                    },
                )
            )
    return batches


def new_token_loss(folder: Path, batches: list, new_ids: list[int]) -> dict:
    """Cross-entropy of one HF model summed over masked positions whose label is a new id (and,
    as a check against the trainer's val_loss, over all masked positions of pass 0)."""
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    new = torch.tensor(sorted(new_ids))
    new_sum, new_n, all_sum, all_n = 0.0, 0, 0.0, 0
    per_pass: dict[int, list[float]] = {}  # pass -> [loss sum, positions]: the spread over masks
    with torch.no_grad():
        for k, batch in batches:
            labels = batch["labels"]
            logits = model(**{n: t for n, t in batch.items() if n != "labels"}).logits
            ce = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2).double(),
                labels,
                ignore_index=IGNORE_INDEX,
                reduction="none",
            )
            is_new = torch.isin(labels, new)
            new_sum, new_n = new_sum + float(ce[is_new].sum()), new_n + int(is_new.sum())
            acc = per_pass.setdefault(k, [0.0, 0])
            acc[0], acc[1] = acc[0] + float(ce[is_new].sum()), acc[1] + int(is_new.sum())
            if k == 0:
                seen = labels != IGNORE_INDEX
                all_sum, all_n = all_sum + float(ce[seen].sum()), all_n + int(seen.sum())
    return {
        "new_token_loss": round(new_sum / max(new_n, 1), 4),
        "new_positions": new_n,
        "per_pass": [round(t / max(n, 1), 4) for t, n in per_pass.values()],
        "pass0_val_loss": round(all_sum / max(all_n, 1), 4),
        "pass0_masked": all_n,
    }


def new_token_eval(b: Bench, shards: Path, ext_report: dict) -> dict:
    """Loss on new-token positions of every arm at step 0 and at the end, one evaluator, the
    same masks for every model; plus how many distinct new-token occurrences the split has."""
    import numpy as np

    from bertforge.data_prep.reader import ShardReader

    new_ids = [t["id"] for t in ext_report["new_tokens"]]
    folders = export_arms(b)
    batches = validation_batches(
        shards, b.out / "runs" / "continued", b.args.mask_passes, b.args.global_batch_size
    )
    reader = ShardReader(shards, "validation")
    occurrences = sum(int(np.isin(reader[i].input_ids, new_ids).sum()) for i in range(len(reader)))
    result = {
        "mask_passes": b.args.mask_passes,
        "new_token_occurrences_in_validation": occurrences,
    }
    for arm, by_when in folders.items():
        result[arm] = {when: new_token_loss(f, batches, new_ids) for when, f in by_when.items()}
        log.info(f"new-token loss {arm}: {result[arm]}")
    return result
