"""Models to evaluate: our run folders (a checkpoint step, every step, or the newest complete one)
and Hugging Face folders, named on the command line as ``PATH``, ``RUN@STEP`` or ``RUN@all``, each
optionally labelled for the table as ``LABEL=...`` (default: the folder's name).

A run's checkpoint is turned into a Hugging Face folder by ``pretrain.export.hf_export.export``
(into a temporary folder, so there is one conversion path for export, evaluation and attention
maps); a Hugging Face folder is used as it is. ``ModelSource.build`` then makes a fresh task model
(``AutoModelForSequenceClassification`` / ``AutoModelForTokenClassification``) whose encoder holds
the source's weights and whose head is new. An encoder weight that does not load is an error, never
a silently random layer.

An arch whose spec says ``task_head_from_mlm`` (ModernBERT, ours as ``pretrain.export`` writes it
or one written by transformers): its task models put transformers' prediction head (dense,
activation, norm) between the encoder and the classifier, the same module as the masked-LM head's,
so its pretrained weights are loaded as ``from_pretrained`` loads them; only the classifier is new.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.logs import transformers_errors_only
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import list_complete

_SPEC_RE = re.compile(r"^(?P<path>.+?)(?:@(?P<step>all|\d+))?$")
_LABEL_RE = re.compile(r"^(?P<label>[\w.+-]+)=(?P<rest>.+)$")  # LABEL=PATH; a label has no "/"
_HEAD_PREFIXES = ("classifier.", "bert.pooler.")  # new in every task model
# Outside the encoder, shared by the pretraining and the task models: ModernBERT's prediction head
_SHARED_HEAD_PREFIXES = ("head.",)


class ModelError(UserError, ValueError):
    """A model argument that names no usable model (the message says what to give instead)."""


@dataclass
class ModelRef:
    """One model to evaluate: a label for the table, its HF folder (after export) and step."""

    label: str
    path: Path  # the run or HF folder as given
    step: int | None = None  # None for an HF folder
    checkpoint: Path | None = None  # run folders only
    hf_dir: Path | None = None  # set by materialize()

    @property
    def run(self) -> str | None:
        """The run folder, for grouping checkpoints of one run."""
        return str(self.path) if self.checkpoint is not None else None

    def as_record(self) -> dict[str, Any]:
        """The model as a results file lists it (label, folder, step, run, checkpoint)."""
        return {
            "label": self.label,
            "path": str(self.path),
            "step": self.step,
            "run": self.run,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
        }


def _is_hf_folder(path: Path) -> bool:
    weights = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
    return (path / "config.json").is_file() and any((path / w).exists() for w in weights)


def split_label(spec: str) -> tuple[str | None, str]:
    """``LABEL=PATH[@STEP]`` -> (LABEL, PATH[@STEP]); a spec without a label -> (None, spec)."""
    m = _LABEL_RE.match(spec)
    return (m.group("label"), m.group("rest")) if m else (None, spec)


def resolve(spec: str) -> list[ModelRef]:
    """Turn ``[LABEL=]PATH``, ``[LABEL=]RUN@STEP`` or ``[LABEL=]RUN@all`` into model references
    (labelled LABEL, or the folder's name; a run's checkpoints as LABEL@STEP)."""
    label, spec = split_label(spec)
    m = _SPEC_RE.match(spec)
    path, step = Path(m.group("path")), m.group("step")
    label = label or path.name
    if RunFolder(path).checkpoints.is_dir():
        found = list_complete(RunFolder(path).checkpoints)
        if not found:
            raise ModelError(f"{path}: the run has no complete checkpoint")
        if step == "all":
            chosen = found
        elif step is not None:
            chosen = [(s, p) for s, p in found if s == int(step)]
            if not chosen:
                raise ModelError(
                    f"{spec}: no complete checkpoint of step {step}; complete steps: "
                    f"{[s for s, _ in found]}"
                )
        else:
            chosen = found[-1:]
        return [ModelRef(f"{label}@{s}", path, s, p) for s, p in chosen]
    if step is not None:
        raise ModelError(
            f"{spec}: @STEP works on run folders (with checkpoints/), and {path} is not one"
        )
    if _is_hf_folder(path):
        return [ModelRef(label, path)]
    raise ModelError(
        f"{path}: neither a run folder (checkpoints/) nor a Hugging Face folder "
        "(config.json + model.safetensors); give one of those"
    )


def resolve_all(specs: list[str]) -> list[ModelRef]:
    """Every model of the command line; two with one label are an error naming both."""
    refs = [ref for spec in specs for ref in resolve(spec)]
    seen: dict[str, ModelRef] = {}
    for ref in refs:
        if ref.label in seen:
            raise ModelError(
                f"two models are labelled {ref.label!r} ({seen[ref.label].path} and {ref.path}); "
                "label them on the command line, e.g. --models base=PATH domain=PATH"
            )
        seen[ref.label] = ref
    return refs


def materialize(ref: ModelRef, workdir: str | Path | None = None) -> Path:
    """The HF folder of ``ref``: exported into ``workdir`` (a new temp dir if None) for runs."""
    if ref.checkpoint is None:
        ref.hf_dir = ref.path
        return ref.path
    # Lazy: the export imports the model registry, which imports transformers (seconds); the
    # evaluate command's --help and an HF folder's evaluation do without it.
    from bertforge.pretrain.export.hf_export import export

    workdir = Path(workdir or tempfile.mkdtemp(prefix="bertforge_eval_"))
    out = workdir / ref.label.replace("@", "_step")  # labels are unique, folder names may not be
    if not _is_hf_folder(out):
        export(ref.path, out, checkpoint=str(ref.checkpoint), verify=False)
    ref.hf_dir = out
    return out


def task_model_class(task_type: str):
    """The transformers Auto class of a task type."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    import transformers

    if task_type == "classification":
        return transformers.AutoModelForSequenceClassification
    return transformers.AutoModelForTokenClassification


def _task_config(config, labels: list[str]):
    config = config.__class__.from_dict(config.to_dict())
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {lab: i for i, lab in enumerate(labels)}
    config.architectures = None
    return config


def _load_encoder(model: torch.nn.Module, state_dict: dict[str, Any], where: str) -> None:
    """Copy the encoder weights of a pretraining state dict (and ModernBERT's prediction head
    when the state dict has it); every encoder weight must load."""
    own = model.state_dict()
    prefix = model.base_model_prefix + "."
    shared = (prefix, *_SHARED_HEAD_PREFIXES)
    take = {k: v for k, v in state_dict.items() if k in own and k.startswith(shared)}
    missing = [
        k
        for k in own
        if k.startswith(prefix)
        and k not in take
        and not k.startswith(_HEAD_PREFIXES)
        and not k.endswith("position_ids")
    ]
    if missing:
        raise ModelError(f"{where}: encoder weights missing for the task model: {missing[:5]}")
    bad = [k for k, v in take.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise ModelError(f"{where}: weight shapes differ from the config: {bad[:5]}")
    model.load_state_dict(take, strict=False)


class ModelSource:
    """Builds fresh task models from one set of pretrained weights (kept in memory once)."""

    def __init__(self, config, state_dict: dict[str, Any], tokenizer, where: str):
        self.config, self.state_dict, self.tokenizer, self.where = (
            config,
            state_dict,
            tokenizer,
            where,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelSource:
        """Weights, config and tokenizer of an HF folder."""
        # Lazy: transformers takes seconds to import; only this path needs it.
        import transformers

        # Lazy: the model registry imports transformers too (see materialize).
        from bertforge.pretrain.model.registry import spec_for_model_type

        path = Path(path)
        config = transformers.AutoConfig.from_pretrained(str(path))
        # the MLM head's weights are unused here on purpose: keep transformers' load report quiet
        # while loading (its other warnings stay on afterwards)
        transformers.logging.disable_progress_bar()
        # the bare encoder; weights the folder lacks (e.g. the pooler of an MLM-only model) were
        # initialised at random here and are dropped, so the task model initialises them by seed
        spec = spec_for_model_type(config.model_type)
        if spec is not None and spec.task_head_from_mlm:  # the encoder and the MLM's head
            auto, prefix = transformers.AutoModelForMaskedLM, ""
        else:
            auto, prefix = transformers.AutoModel, None
        with transformers_errors_only():
            model, info = auto.from_pretrained(str(path), output_loading_info=True)
        absent = set(info.get("missing_keys", []))
        if prefix is None:
            prefix = getattr(model, "base_model_prefix", "bert") + "."
        sd = {f"{prefix}{k}": v for k, v in model.state_dict().items() if k not in absent}
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
        return cls(config, sd, tok, str(path))

    @classmethod
    def from_state_dict(
        cls, hf_state_dict: dict[str, Any], hf_config, tokenizer_dir: str | Path
    ) -> ModelSource:
        """Weights with transformers' names (``model.hf_state_dict(unpad_vocab=True)``)."""
        # Lazy: transformers takes seconds to import; only this path needs it.
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        return cls(hf_config, hf_state_dict, tok, "state dict")

    def build(self, task_type: str, labels: list[str]) -> torch.nn.Module:
        """A new task model: the source's encoder, a freshly initialised head."""
        conf = _task_config(self.config, labels)
        model = task_model_class(task_type).from_config(conf)
        _load_encoder(model, self.state_dict, self.where)
        return model

    def build_for(self, kind: str, labels: list[str]) -> torch.nn.Module:
        """A new sequence model of a benchmark task: ``kind`` "classification" (a class per
        label) or "regression" (one output, mean-squared error, as STS-B's)."""
        if kind != "regression":
            return self.build("classification", labels)
        conf = _task_config(self.config, ["score"])
        conf.problem_type = "regression"
        model = task_model_class("classification").from_config(conf)
        _load_encoder(model, self.state_dict, self.where)
        return model

    def with_encoder_of(self, model: torch.nn.Module, where: str) -> ModelSource:
        """The same tokenizer and config with the encoder of a fine-tuned task ``model`` (a task
        that starts from the MNLI fine-tuned model); its classifier is left behind."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return ModelSource(self.config, state, self.tokenizer, where)
