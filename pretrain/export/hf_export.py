"""Export a training checkpoint as a standard Hugging Face folder.

    bertforge export RUN --output HF_DIR [--checkpoint RUN/checkpoints/step_00001000]
    bertforge export RUN --output HF_DIR --average last:3   (or --average 800,900,1000)

Consolidates the ZeRO-2 or ZeRO-3 shards with DeepSpeed's ``zero_to_fp32`` helper, loads them
into the training model (strict), maps to ``BertForMaskedLM`` / ``BertForPreTraining`` names, slices
the vocabulary padding off, and writes ``model.safetensors`` + ``config.json`` + the tokenizer
+ a model card (README.md, see :mod:`pretrain.export.model_card`). With ``--average`` the weights
are the element-wise mean of several checkpoints (:mod:`pretrain.export.average`), and the card
lists their steps.
Then it reloads the folder with transformers and shows what it predicts on a sentence (fill-mask;
for RTD the discriminator's replaced-token detection, and fill-mask on the generator): a folder
that does not load with zero missing and unexpected keys is reported as an error, not written
silently (:mod:`pretrain.export.verify`).

Another arch's run is exported as its model's ``hf_architecture`` (the tokenizer's special-token
ids written into its config where the arch's adapter names them: ModernBERT's).

A run trained with ``--share_layers all|groups:G`` (ALBERT-style sharing) is exported as the same
standard BERT class with the shared weights copied into every layer that uses them: the folder
loads anywhere ``BertForMaskedLM`` does and computes exactly what the trained model computes; it is
as large on disk as an unshared model of the same depth.

Imports inside functions here: transformers, and the model registry (which imports it), take
seconds to import; only writing and verifying a folder needs them, not ``--help``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bertforge.cli import command_parser
from bertforge.data_prep.object_store import Store, is_url
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.files import publish_dir
from bertforge.logs import get_logger, quiet_libraries, quiet_transformers, report
from bertforge.pretrain.components.ema import load_ema
from bertforge.pretrain.export.average import AverageError, average_checkpoints, select_checkpoints
from bertforge.pretrain.export.hf_extras import (
    POOLER_NOTE,
    adds_pooler,
    initialised_pooler,
    trained_length,
)
from bertforge.pretrain.export.model_card import benchmark_section, write_model_card
from bertforge.pretrain.export.probe import ProbeText, held_out_text
from bertforge.pretrain.export.verify import (
    GENERATOR_DIR,
    check_lines,
    verify_detector,
    verify_export,
)
from bertforge.pretrain.model.specs import ObjectiveSpec, objective_of_run
from bertforge.pretrain.objectives.registry import objective_for
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import (
    MARKER,
    CheckpointError,
    consolidated_state_dict,
    is_complete,
    list_complete,
    read_state,
    resolve_resume,
    run_tokenizer_dir,
)

log = get_logger(__name__)


def find_checkpoint(run: Path, checkpoint: str | None = None) -> Path:
    """The checkpoint to export: ``checkpoint``, else the newest complete one of ``run``; a
    CheckpointError naming the path and where checkpoints are found when there is none."""
    where = Path(checkpoint) if checkpoint else run
    flag = "--checkpoint" if checkpoint else "export"  # names the command in the messages
    how = (
        "Give the --output_dir of a training run that saved a checkpoint (its checkpoints/ "
        f"folder holds step_* folders with a {MARKER} marker), or one such folder with "
        "--checkpoint; `ls RUN/checkpoints` lists them."
    )
    if not where.exists():
        raise CheckpointError(
            f"{flag} {where}: no such folder, so no complete checkpoint there. {how}"
        )
    if not (
        is_complete(where)
        or list_complete(where)
        or list_complete(RunFolder(where).checkpoints)
        or where.name.startswith("step_")  # an unfinished one: resolve_resume says so
    ):
        raise CheckpointError(f"{flag} {where}: no complete checkpoint there. {how}")
    ckpt = resolve_resume(str(where), run, flag=flag)  # a run folder: its newest
    if ckpt is None or not is_complete(ckpt):
        raise CheckpointError(f"{run}: no complete checkpoint to export")
    return ckpt


def trained_rope_theta(state: dict[str, Any]) -> float | None:
    """The global rope theta a checkpoint's last step trained with when its run's phase plan set
    one (``rope_theta`` of that step's phase), else None (the model config's)."""
    plan = (state.get("phases") or {}).get("phases") or []
    step = int(state.get("step", 0)) - 1
    for ph in plan:
        if ph["start_step"] <= step < ph["end_step"] or ph is plan[-1]:
            return ph.get("rope_theta")
    return None


def load_weights(model, sd: dict[str, Any], ckpt: Path) -> None:
    """Load checkpoint ``ckpt``'s weights ``sd`` into ``model``, every key of both accounted for.
    ``sd`` may omit the tied decoder weight (some DeepSpeed versions' consolidated dict) and,
    with --share_layers, the later names of a shared weight whose first name it holds (the EMA
    keeps each Parameter once: ``named_parameters``)."""
    missing, unexpected = model.load_state_dict(sd, strict=False)
    omitted = set(model.tied_keys) | {s.key for s in model.shared_keys if s.owner in sd}
    missing = [k for k in missing if k not in omitted]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {ckpt} does not match the model it was trained with: "
            f"missing {missing}, unexpected {unexpected}"
        )


def export(
    run: str | os.PathLike,
    output: str | os.PathLike,
    checkpoint: str | None = None,
    verify: bool = True,
    *,
    language: list[str] | None = None,
    datasets: list[str] | None = None,
    average: str | None = None,
    ema: bool = False,
    glue_results: str | None = None,
    glue_model: str | None = None,
    probe_text: str | None = None,
) -> dict[str, Any]:
    """Write the HF folder for the newest complete checkpoint of ``run`` (or ``checkpoint``, or
    the mean of the checkpoints ``average`` names: ``last:K`` or steps ``100,200``), with a model
    card (README.md; ``language`` and ``datasets`` go into its YAML header). ``ema``: the
    checkpoint's EMA weights (``--ema`` of the trainer) instead of its weights. ``glue_results``:
    a glue.json (or clue.json) of ``pretrain.evaluate`` whose row ``glue_model`` joins the card.
    ``probe_text``: the check's text (default: held-out text of the run's data)."""
    import torch

    # a bad results file fails before any weight is read
    benchmark = benchmark_section(glue_results, glue_model) if glue_results else None
    run, output = Path(run), Path(output)
    ckpt, sd, state = _checkpoint_weights(run, checkpoint, average, ema)
    nsp = bool(state.get("nsp", False))
    spec = objective_of_run(state["config"], nsp)
    model = _trained_model(state, sd, ckpt, spec)
    hf_model, conf, tok = _hf_model(model, run, state)
    # the objective's writers: replaced-token detection's discriminator is the export, a
    # generator that a transformers class holds goes beside it
    objective = objective_for(spec)
    generator = objective.generator_export(model)
    pooler = adds_pooler(model.arch, objective.pooler_task is not None) and objective.export_pooler
    extra = initialised_pooler(conf, state["config"]["run"]["seed"]) if pooler else {}
    if pooler:
        hf_model.config.bertforge_pooler = POOLER_NOTE
    result: dict[str, Any] = {
        "checkpoint": str(ckpt),
        "step": state["step"],
        "output": str(output),
        "architecture": model.hf_architecture,
        "share_layers": model.share_layers,
        "averaged_steps": state.get("averaged_steps"),
    }
    # Published (replacing an earlier export) only once it is written and, unless --no_verify,
    # reloads cleanly: a failed check leaves the old folder as it was.
    with publish_dir(output, replace=True) as tmp:
        with torch.no_grad():
            weights = {**hf_model.state_dict(), **extra} if extra else None
            hf_model.save_pretrained(str(tmp), state_dict=weights, safe_serialization=True)
        tok.save_pretrained(str(tmp))
        write_model_card(
            tmp,
            run,
            state,
            architecture=model.hf_architecture,
            tokenizer=tok,
            parameters=sum(p.numel() for p in [*hf_model.parameters(), *extra.values()]),
            pooler=_pooler_line(model.arch, objective.pooler_task),
            language=language,
            datasets=datasets,
            benchmark=benchmark,
        )
        if generator is not None:
            result["generator"] = str(output / GENERATOR_DIR)
            objective.write_generator(tmp / GENERATOR_DIR, *generator, tok)
        if verify:
            probe = ProbeText(probe_text, "--probe_text") if probe_text else None
            probe = probe or held_out_text(state, tok)
            result["probe_source"] = probe.source
        if verify and objective.export_detects:
            result.update(
                verify_detector(tmp, model.hf_architecture, generator is not None, probe.text)
            )
        elif verify:
            auto = objective.export_auto_class
            result.update(verify_export(tmp, auto, pooler=pooler, probe=probe.text))
    return result


def _checkpoint_weights(
    run: Path, checkpoint: str | None, average: str | None, ema: bool
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The weights to export, as (the checkpoint whose state describes the run, the weights,
    that state): one checkpoint's (or its EMA's), or the mean of those ``average`` names."""
    if average and checkpoint:
        raise AverageError("--average and --checkpoint name the weights twice: give one")
    if average and ema:
        raise AverageError("--average and --ema name the weights twice: give one")
    if average:  # the newest averaged checkpoint's state describes the run (step, data, card)
        chosen = select_checkpoints(run, average)
        ckpt = chosen[-1][1]
        sd = average_checkpoints([path for _, path in chosen])
        state = {**read_state(ckpt), "averaged_steps": [step for step, _ in chosen]}
    else:
        ckpt = find_checkpoint(run, checkpoint)
        sd = load_ema(ckpt) if ema else consolidated_state_dict(ckpt)
        state = {**read_state(ckpt), **({"ema_weights": True} if ema else {})}
    return ckpt, sd, state


def _trained_model(state: dict[str, Any], sd: dict[str, Any], ckpt: Path, spec: ObjectiveSpec):
    """The training model the checkpoint's config builds, holding the weights ``sd`` at the rope
    theta its last step trained with."""
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model

    model_cfg = ModelConfig(**state["config"]["model_cfg"])
    model = build_model(
        model_cfg,
        vocab_size=int(state["vocab_size"]),
        objective=spec,
    )
    load_weights(model, sd, ckpt)
    theta = trained_rope_theta(state)
    if theta is not None:  # a phase plan's rope_theta: the one the checkpoint's weights ended at
        model.set_global_rope_theta(theta)
    return model


def _hf_model(model, run: Path, state: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``model`` as its transformers class (vocabulary padding sliced off, weights tied) with its
    config and the run's tokenizer: (HF model, HF config, tokenizer)."""
    import transformers

    from bertforge.pretrain.model.registry import ARCHES

    hf_cls = getattr(transformers, model.hf_architecture)
    conf = model.hf_config(unpad_vocab=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(run_tokenizer_dir(run, state)))
    # the special-token ids the arch's config names (ModernBERT's; BERT's needs none)
    ARCHES[model.arch].adapter.set_tokenizer_ids(conf, tok)
    hf_model = hf_cls(conf)
    hf_sd = model.hf_state_dict(unpad_vocab=True)
    missing, unexpected = hf_model.load_state_dict(hf_sd, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"name mapping to {model.hf_architecture} failed: missing {missing}, "
            f"unexpected {unexpected}"
        )
    hf_model.tie_weights()
    tok.model_max_length = trained_length(state, conf.max_position_embeddings, tok)
    return hf_model, conf, tok


def _pooler_line(arch: str, task: str | None) -> str | None:
    """The model card's account of BERT's pooler (ModernBERT has none): trained by ``task``
    (the objective's pair task), or not trained."""
    if arch != "bert":
        return None
    return f"trained ({task})" if task else POOLER_NOTE


def _export_to(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`export` with the command's arguments; an ``--output`` URL in object storage is
    written into a temporary folder here, then uploaded (config.json last)."""
    store, target, staging = None, args.output, None
    if is_url(args.output):
        store = Store(args.output, flag="--output")
        staging = tempfile.mkdtemp(prefix="bertforge-export-")
        target = os.path.join(staging, "model")
    try:
        res = export(
            args.run,
            target,
            args.checkpoint,
            verify=not args.no_verify,
            language=args.language,
            datasets=args.dataset,
            average=args.average,
            ema=args.ema,
            glue_results=args.glue_results,
            glue_model=args.glue_model,
            probe_text=args.probe_text,
        )
        if store is not None:
            store.put_tree(Path(target), last="config.json")
            res["output"] = store.url_of()
        return res
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = command_parser("bertforge export", __doc__)
    p.add_argument("run", help="run folder (its newest complete checkpoint is exported)")
    p.add_argument(
        "--output",
        required=True,
        help="HF folder to write, or a URL in object storage (s3://..., written here, uploaded)",
    )
    p.add_argument("--checkpoint", default=None, help="a specific checkpoint folder instead")
    p.add_argument(
        "--average",
        default=None,
        metavar="last:K|S1,S2,...",
        help="export the element-wise mean of the newest K complete checkpoints, or of those "
        "steps (one architecture and vocabulary); the model card lists the steps",
    )
    p.add_argument(
        "--ema",
        action="store_true",
        help="export the checkpoint's EMA weights (a run trained with --ema DECAY)",
    )
    p.add_argument("--no_verify", action="store_true", help="skip the transformers reload check")
    p.add_argument(
        "--probe_text",
        default=None,
        metavar="TEXT",
        help="the check's text: one word of it is masked for fill-mask (RTD: one token replaced); "
        "default: a passage of the run's held-out data, in its language and domain",
    )
    p.add_argument("--language", nargs="+", default=[], help="model card: language codes (en zh)")
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        help="model card: a dataset name for its header (repeat for several)",
    )
    p.add_argument(
        "--glue_results",
        default=None,
        metavar="FILE",
        help="model card: the GLUE (or CLUE) scores of this model from a glue.json of "
        "bertforge evaluate --glue",
    )
    p.add_argument(
        "--glue_model", default=None, help="its row in that file (default: the only one)"
    )
    args = p.parse_args(argv)
    quiet_libraries()
    quiet_transformers()
    try:
        res = _export_to(args)
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    what = f"{res['checkpoint']} (step {res['step']})"
    if res["averaged_steps"]:
        steps = ", ".join(str(s) for s in res["averaged_steps"])
        what = f"the mean of the checkpoints of steps {steps} of {args.run}"
    lines = [f"exported {what} as {res['architecture']} to {res['output']}"]
    if res["share_layers"] != "none":
        lines.append(
            f"  trained with --share_layers {res['share_layers']}: the shared weights are copied "
            "into every layer of the exported model"
        )
    lines += check_lines(res)
    report(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
