"""The model card (README.md) of an exported folder, in the Hugging Face model-card form.

Everything in it is read from the run folder, never typed by hand: ``RUN/config.json`` (the
resolved settings and the exact command), ``RUN/metrics.jsonl`` (tokens seen, the last
validation at or before the exported step) and the checkpoint's ``trainer_state.json`` (step,
data sources); the data summary comes from each source's ``manifest.json`` when the shard folder
is still there. The YAML header carries language, a license placeholder, tags and datasets as
the user gives them (``bertforge export ... --language en --dataset NAME``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from bertforge.data_prep.reader import ShardError, load_manifest
from bertforge.errors import UserError
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.layout import RunFolder

_REPOSITORY = Path(__file__).resolve().parents[2]  # pretrain/export/ -> the repository
LICENSE_PLACEHOLDER = "other"  # the user sets the real one; the card says so
TAGS = ("bert", "fill-mask", "masked-lm", "deepspeed", "bertforge")


def card_facts(run: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The numbers a card shows, from the run folder, for the checkpoint whose ``state`` is given.

    tokens_seen sums the per-step ``tokens`` (all ranks) of metrics.jsonl up to the checkpoint's
    step; ``validation`` is the last overall validation record at or before that step (or None).
    """
    step = int(state["step"])
    metrics = RunFolder(run).metrics
    train = read_metrics(metrics, "train") if metrics.is_file() else []
    val = read_metrics(metrics, "validation") if metrics.is_file() else []
    val = [r for r in val if "source" not in r and int(r["step"]) <= step]
    config_path = RunFolder(run).config
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    return {
        "step": step,
        "consumed_samples": state.get("consumed_samples"),
        "tokens_seen": int(sum(r.get("tokens", 0) for r in train if int(r["step"]) <= step)),
        "validation": val[-1] if val else None,
        "config": config or state.get("config", {}),
        "argv": config.get("argv"),
        "data": state.get("data_mixture") or [],
        "precision": config.get("precision_resolved") or state.get("precision"),
        "world_size": config.get("world_size") or state.get("world_size"),
        "averaged_steps": state.get("averaged_steps"),  # set by export --average
        "anneal_from": state.get("anneal_from") or config.get("anneal_from"),
    }


# An absolute path in the card's text: "/" at a word's start (not in a URL, "tokens/s" or "1/2").
_ABSOLUTE = re.compile(r"(?<![\w:/.~-])/[\w.+@%~-]+(?:/[\w.+@%~-]+)*/?")


def relative_paths(text: str, run: Path) -> str:
    """``text`` with each absolute path made relative to the run folder (``checkpoints/...``,
    ``../shards``) or to the repository (``pretrain/main.py``, ``ds_configs/cpu.json``); one
    further away is shown by its last name only: the card travels with the weights and says
    nothing of the machine that trained them."""
    base = Path(os.path.abspath(run))

    def shown(match: re.Match) -> str:
        path = Path(match.group(0).rstrip("/"))
        rel = os.path.relpath(path, base)
        if rel.split(os.sep).count("..") <= 2:
            return rel
        return str(path.relative_to(_REPOSITORY)) if path.is_relative_to(_REPOSITORY) else path.name

    return _ABSOLUTE.sub(shown, text)


def _yaml_list(key: str, values: list[str]) -> list[str]:
    if not values:
        return []
    return [f"{key}:"] + [f"- {json.dumps(v, ensure_ascii=False)}" for v in values]


def _header(language: list[str], datasets: list[str], arch: str = "bert") -> list[str]:
    tags = [arch, *TAGS[1:]]  # the first tag names the architecture (its --arch)
    lines = [
        "---",
        *_yaml_list("language", language),
        f"license: {LICENSE_PLACEHOLDER}  # placeholder: set the license of your weights",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        *_yaml_list("tags", tags),
        *_yaml_list("datasets", datasets),
        "---",
    ]
    return lines


def _manifest_or_none(folder: Path) -> dict[str, Any] | None:
    """The shard folder's manifest, or None when it is gone or unreadable (the card then says
    what the checkpoint recorded)."""
    try:
        return load_manifest(folder)
    except ShardError:
        return None


def _data_lines(data: list[dict[str, Any]]) -> list[str]:
    out = []
    for src in data:
        line = f"- `{src.get('name')}` ({src.get('path')}), weight {src.get('weight')}"
        m = _manifest_or_none(Path(str(src.get("path"))))
        if m is not None:
            splits = ", ".join(
                f"{name}: {s.get('documents', 0):,} documents, "
                f"{s.get('sequences', 0):,} sequences, {s.get('tokens', 0):,} tokens"
                for name, s in m.get("splits", {}).items()
            )
            line += f"; format {m.get('format')}, max_seq_len {m.get('max_seq_len')}; {splits}"
        else:
            line += f"; {src.get('sequences')} training sequences (manifest no longer there)"
        out.append(line)
    return out or ["- (not recorded)"]


def _origin(cfg: dict[str, Any]) -> str:
    init = cfg.get("init_from") or {}
    source = init.get("source") or init.get("path") or cfg.get("run", {}).get("init_from")
    if source:
        return f"Pretrained with bertforge (DeepSpeed), initialised from `{source}`."
    return "Pretrained from scratch with bertforge (DeepSpeed)."


def _initial_weights(cfg: dict[str, Any]) -> list[str]:
    """The card's account of an --init_from start: which weights came from the source, which
    were new, which of the source's were left out."""
    init = cfg.get("init_from")
    if not isinstance(init, dict) or "loaded" not in init:
        return []
    loaded, new, ignored = (
        init["loaded"],
        init.get("newly_initialised", []),
        init.get("ignored", []),
    )
    vocab = init.get("vocabulary") or {}
    lines = [
        "## Initial weights",
        "",
        f"- from `{init.get('source')}` ({init.get('kind')}): {len(loaded)} tensors loaded "
        f"({_prefix_summary(loaded)})",
        f"- newly initialised: {len(new)}" + (f" ({', '.join(new)})" if new else ""),
        f"- in the source but not used: {len(ignored)}"
        + (f" ({', '.join(ignored)})" if ignored else ""),
    ]
    if vocab.get("new_count"):
        lines.append(
            f"- vocabulary: {vocab.get('relation')}, {vocab['new_count']} new rows initialised "
            "as the mean of their base pieces"
        )
    lines += [f"- note: {n}" for n in init.get("notes", [])]
    return [*lines, ""]


def _prefix_summary(keys: list[str]) -> str:
    """Tensor names grouped by their part of the model: "bert.embeddings 5, bert.encoder 96"."""
    counts: dict[str, int] = {}
    for k in keys:
        head = ".".join(k.split(".")[:2])
        counts[head] = counts.get(head, 0) + 1
    return ", ".join(f"{h} {n}" for h, n in counts.items())


def _command(argv: list[str] | None, world_size: int | None) -> str:
    """The command line as launched; a launcher's per-rank --local_rank is left out."""
    if not argv:
        return "(not recorded: a run from before config.json kept the command)"
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--local_rank", "--local-rank"):
            skip = True
            continue
        if not a.startswith(("--local_rank=", "--local-rank=")):
            args.append(a)
    # the console script (or python -m bertforge) as the user typed it, a script with python
    typed = Path(args[0]).name == "bertforge" or args[0].endswith("bertforge/__main__.py")
    line = shlex.join(["bertforge", *args[1:]] if typed else ["python", *args])
    if world_size and int(world_size) > 1:
        return f"# on {world_size} ranks (deepspeed / torchrun launcher), each rank ran:\n{line}"
    return line


def _anneal(plan: dict[str, Any] | None) -> list[str]:
    """The card's line for an --anneal_from run (pretrain.schedule.anneal)."""
    if not plan:
        return []
    return [
        f"- annealed from `{plan['source_run']}` step {plan['source_step']:,} for "
        f"{plan['tokens']:,} tokens on {', '.join(plan['data'])} ({plan['steps']:,} steps, lr "
        f"{plan['source_lr']:.4g} -> {plan['min_lr_ratio'] * plan['peak_lr']:.4g}, "
        f"{plan['shape']}; the source had seen {plan['consumed_samples']:,} sequences)"
    ]


def _sharing(model: dict[str, Any]) -> list[str]:
    """A line for a model trained with cross-layer sharing (the export repeats the weights)."""
    share = model.get("share_layers", "none")
    if share in (None, "none"):
        return []
    return [
        f"- trained with shared layer weights (`--share_layers {share}`); this folder holds a "
        "copy in every layer, so the parameter count above counts each copy"
    ]


def benchmark_section(path: str | Path, label: str | None) -> list[str]:
    """The model card's lines for one model of a ``bertforge evaluate --glue`` (or
    ``--clue``) results file: each task's dev scores, median [min, max] over the seeds, the
    benchmark score and how it was run. ``label``: the model's row (None: the file's only one)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        bench, rows = doc["benchmark"], doc["models"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"--glue_results {path}: not a glue.json/clue.json of bertforge evaluate ({e})"
        ) from None
    if label is None and len(rows) == 1:
        label = next(iter(rows))
    if label not in rows:
        raise UserError(
            f"--glue_results {path}: give --glue_model, one of {sorted(rows)}"
            if label is None
            else f"--glue_model {label}: not in {path}; its models: {sorted(rows)}"
        )
    lines = [f"## {bench.upper()} (dev)", "", "| task | metric | x 100 |", "|---|---|---|"]
    for r in (r for r in doc["results"] if r["model"] == label):
        for name, metrics in r["evals"].items():
            for metric, st in metrics.items():
                cell = f"{100 * st['median']:.1f} [{100 * st['min']:.1f}, {100 * st['max']:.1f}]"
                lines.append(f"| {name} | {metric} | {cell} |")
    score = rows[label].get(bench)
    lines += [
        f"| **{bench.upper()}** | {doc['score']} | "
        + ("(not every task of the average was run)" if score is None else f"{100 * score:.1f}")
        + " |",
        "",
        f"Protocol `{doc['protocol']}` ({doc['protocol_source']}); {doc['reported']}. Fine-tuned "
        f"on {doc['device']} with `bertforge evaluate --glue` ({path.name}).",
        "",
    ]
    return lines


def render_card(
    facts: dict[str, Any],
    *,
    architecture: str,
    parameters: int,
    tokenizer: dict[str, Any],
    language: list[str],
    datasets: list[str],
    pooler: str | None = None,
    benchmark: list[str] | None = None,
) -> str:
    """README.md text: YAML header, then size, tokenizer, data, training, validation, command."""
    cfg = facts["config"]
    model = cfg.get("model_cfg", {})
    masking = cfg.get("masking", {})
    val = facts["validation"]
    lines = _header(language, datasets, model.get("arch", "bert")) + [
        "",
        f"# {model.get('name') or 'BERT'} masked language model",
        "",
        _origin(cfg) + " Every number below comes from the run folder.",
        "",
        "## Model",
        "",
        f"- architecture: {architecture}",
        f"- parameters: {parameters:,}",
        f"- hidden size {model.get('hidden_size')}, layers {model.get('num_hidden_layers')}, "
        f"attention heads {model.get('num_attention_heads')}, "
        f"feed-forward {model.get('intermediate_size')}",
        *_sharing(model),
        *([f"- pooler: {pooler}"] if pooler else []),
        "",
        *_initial_weights(cfg),
        "## Tokenizer",
        "",
        f"- {tokenizer.get('class')}, vocabulary {tokenizer.get('vocab_size'):,}, "
        f"lowercase {tokenizer.get('lowercase')}, model_max_length "
        f"{tokenizer.get('model_max_length')} (the longest sequence trained on)",
        "",
        "## Data",
        "",
        *_data_lines(facts["data"]),
        "",
        "## Training",
        "",
        f"- steps: {facts['step']:,}",
        f"- sequences seen: {facts['consumed_samples']:,}"
        if facts["consumed_samples"] is not None
        else "- sequences seen: (not recorded)",
        f"- tokens seen: {facts['tokens_seen']:,}",
        f"- precision: {facts['precision']}, ranks: {facts['world_size']}",
        *_anneal(facts.get("anneal_from")),
        *(
            [f"- weights: the mean of the checkpoints of steps {facts['averaged_steps']}"]
            if facts.get("averaged_steps")
            else []
        ),
        "- masking: " + ", ".join(f"{k} {v}" for k, v in masking.items() if k != "seed"),
        "",
        "## Validation",
        "",
    ]
    if val is None:
        lines.append("No validation record at or before this step.")
    else:
        lines += [
            f"At step {val['step']:,} (masked-LM on the validation split):",
            "",
            "| loss | accuracy | perplexity |",
            "|---|---|---|",
            f"| {val['val_loss']} | {val['val_accuracy']} | {val['val_perplexity']} |",
        ]
    lines += ["", *(benchmark or [])]
    command = _command(facts["argv"], facts["world_size"])
    lines += ["## Training command", "", "```bash", command, "```", ""]
    return "\n".join(lines)


def write_model_card(
    out: Path,
    run: Path,
    state: dict[str, Any],
    *,
    architecture: str,
    parameters: int,
    tokenizer,
    language: list[str] | None = None,
    datasets: list[str] | None = None,
    pooler: str | None = None,
    benchmark: list[str] | None = None,
) -> Path:
    """Write ``out/README.md`` for the checkpoint whose trainer ``state`` is given, paths
    relative to the run folder (:func:`relative_paths`); returns it."""
    tok = {
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "lowercase": getattr(tokenizer, "do_lower_case", None),
        "model_max_length": getattr(tokenizer, "model_max_length", None),
    }
    text = render_card(
        card_facts(run, state),
        architecture=architecture,
        parameters=parameters,
        tokenizer=tok,
        language=list(language or []),
        datasets=list(datasets or []),
        pooler=pooler,
        benchmark=benchmark,
    )
    text = relative_paths(text, run)
    path = out / "README.md"
    path.write_text(text, encoding="utf-8")  # inside export's temporary folder: renamed whole
    return path
