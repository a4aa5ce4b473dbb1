"""GLUE folders in download_glue_data.py's layout, written by the tests (random sentences; the
labels follow a rule only where a test needs the model to learn)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = "the cat dog sat ran on a mat house big small red blue old new car tree".split()
STS_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
)
MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
NLI = ("entailment", "neutral", "contradiction")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))


def write_lines(path: Path, lines: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


def write_glue(root: Path, n_train: int = 48, n_dev: int = 24, seed: int = 0) -> Path:
    """CoLA (no header), MRPC (byte-order mark), STS-B, RTE and MNLI (matched and mismatched dev)
    in download_glue_data.py's layout; a sentence holds a lone ``"`` (quoting must stay off)."""
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("dev", n_dev)):
        cola, mrpc, sts, rte = [], ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"], [STS_HEADER], []
        rte.append("index\tsentence1\tsentence2\tlabel")
        for i in range(n):
            a, b = sentence(rng), sentence(rng)
            same = i % 2 == 0
            cola.append(f"gj04\t{i % 2}\t\t{a} .")
            mrpc.append(f"{i % 2}\t{i}\t{i + 1}\t{a}\t{a if same else b}")
            sts.append(
                f"{i}\tmain-news\tfile\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{5.0 * rng.random():.3f}"
            )
            rte.append(
                f'{i}\t{a} " said\t{a if same else b}\t{"entailment" if same else "not_entailment"}'
            )
        write_lines(root / "CoLA" / f"{split}.tsv", cola)
        write_lines(root / "MRPC" / f"{split}.tsv", mrpc, bom=True)
        write_lines(root / "STS-B" / f"{split}.tsv", sts)
        write_lines(root / "RTE" / f"{split}.tsv", rte)
    for stem, n in (("train", n_train), ("dev_matched", n_dev), ("dev_mismatched", n_dev)):
        rows = [MNLI_HEADER]
        for i in range(n):
            a, b = sentence(rng), sentence(rng)
            lab = NLI[i % 3]
            parses = f"( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})"
            rows.append(f"{i}\t1\t1n\tfiction\t{parses}\t{a}\t{b}\t{lab}\t{lab}")
        write_lines(root / "MNLI" / f"{stem}.tsv", rows)
    return root
