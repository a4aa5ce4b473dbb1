"""One YAML recipe per run: every training setting by section, the flags its overrides.

A recipe is a mapping of sections to fields, named as the config dataclasses name them::

    run:      {data_sources: [runs/demo/shards], model_preset: tiny, max_steps: 200}
    optim:    {lr: 0.001, schedule: wsd, warmup_steps: 20}
    masking:  {mask_prob: 0.15, whole_word: true}

Sections are :data:`SECTIONS` (``model``, ``data`` and ``masking`` are the model's and loader's
dataclasses); a field's flag (``--lr``, ``--mask_prob``, ``--model_dropout`` ...) is generated
from the same field, so ``bertforge train --recipe R.yaml --lr 2e-3`` overrides one
value. The DeepSpeed JSON (``run.ds_config``) keeps the engine: ZeRO, precision blocks, the
optimizer's betas; a setting both can hold is given in one (:mod:`.one_home`). A run
writes its resolved recipe as ``RUN/recipe.yaml`` (every field, launch-only ones left out),
which reproduces it: ``--recipe RUN/recipe.yaml --output_dir NEW``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bertforge.cli import base_type, field_default, suggest
from bertforge.errors import UserError
from bertforge.files import checkout_file

if TYPE_CHECKING:
    from bertforge.pretrain.config.ds_config import DeepSpeedSetup
    from bertforge.pretrain.config.train_config import TrainConfig

#: recipe section -> the TrainConfig attribute it fills
SECTIONS = {
    "run": "run",
    "batch": "batch",
    "optim": "optim",
    "precision": "precision",
    "memory": "memory",
    "speed": "speed",
    "checkpoint": "checkpoint",
    "guard": "guard",
    "log": "log",
    "model": "model_cfg",
    "objective": "objective_cfg",
    "data": "data_cfg",
    "masking": "masking",
}
_GROUP_SECTION = {g: s for s, g in SECTIONS.items()}

#: fields that belong to one launch, not to the run: never written into RUN/recipe.yaml
LAUNCH_ONLY = {
    ("run", "output_dir"),
    ("run", "resume"),
    ("run", "dry_run"),
    ("run", "json"),
    ("run", "show_masks"),
    ("optim", "override_lr_schedule"),
    # this machine's shard cache (object storage): its folder, size and threads, not the run's
    ("data_cfg", "cache_dir"),
    ("data_cfg", "cache_limit"),
    ("data_cfg", "fetch_threads"),
    ("data_cfg", "fetch_retries"),
}
_NOT_SETTABLE = {("model_cfg", "name"), ("model_cfg", "preset")}  # run.model_preset names it


class RecipeError(UserError, ValueError):
    """A recipe file that cannot be used; the message names the file and the key."""


def section_of(group: str) -> str:
    """The recipe section of a TrainConfig attribute (``model_cfg`` -> ``model``)."""
    return _GROUP_SECTION[group]


def load_recipe(path: str | Path, groups: dict[str, type]) -> dict[tuple[str, str], Any]:
    """{(group, field): value} of the recipe at ``path``, each value checked against its field's
    type; an unknown section or key fails naming the file, the key and the closest name."""
    try:
        text = checkout_file(path).read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"--recipe {path}: cannot read it ({e.strerror})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: invalid YAML ({e})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of sections ({', '.join(SECTIONS)})")
    out: dict[tuple[str, str], Any] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise RecipeError(_unknown(path, str(section), SECTIONS, "section"))
        group = SECTIONS[section]
        if not isinstance(values, dict):
            raise RecipeError(f"{path}: section {section} must be a mapping of field: value")
        fields = {f.name: f for f in dataclasses.fields(groups[group])}
        hints = typing.get_type_hints(groups[group])
        for key, value in values.items():
            if key not in fields or (group, key) in _NOT_SETTABLE:
                settable = [f for f in fields if (group, f) not in _NOT_SETTABLE]
                raise RecipeError(_unknown(path, f"{section}.{key}", settable, "key", section))
            out[(group, key)] = _checked(path, f"{section}.{key}", value, hints[key])
    return out


def _unknown(path, name: str, choices, what: str, section: str = "") -> str:
    short = name.split(".")[-1]
    guess = suggest(short, list(choices))
    hint = f"; did you mean {section + '.' if section else ''}{guess}?" if guess else ""
    return f"{path}: unknown {what} {name}{hint} (the sections and keys are the config fields)"


def _checked(path, key: str, value: Any, annotation: Any) -> Any:
    """``value`` as the field's type (an int for a float field, a list for a tuple field)."""
    tp, optional = base_type(annotation)
    origin = typing.get_origin(tp)
    if value is None:
        if optional:
            return None
    elif origin in (list, tuple) and isinstance(value, list):
        return value if origin is list else tuple(value)
    elif tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif tp is bool and isinstance(value, bool):
        return value
    elif tp in (int, str) and isinstance(value, tp) and not isinstance(value, bool):
        return value
    elif origin is None and tp not in (int, float, str, bool):
        return value  # a mapping field: taken as written
    name = getattr(tp, "__name__", str(tp))
    raise RecipeError(f"{path}: {key} must be {name}, got {value!r}")


def recipe_dict(resolved: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The recipe of a resolved config (``resolved_flags``' dict, by TrainConfig attribute):
    every field by section, launch-only ones left out, tuples as lists."""
    out: dict[str, dict[str, Any]] = {}
    for section, group in SECTIONS.items():
        values = resolved.get(group) or {}
        out[section] = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in values.items()
            if (group, k) not in LAUNCH_ONLY and (group, k) not in _NOT_SETTABLE
        }
    return out


def dump_recipe(resolved: dict[str, dict[str, Any]], header: str = "") -> str:
    """YAML text of :func:`recipe_dict` (``header``: comment lines put first)."""
    body = yaml.safe_dump(recipe_dict(resolved), sort_keys=False, default_flow_style=False)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + body


def defaults(groups: dict[str, type]) -> dict[str, dict[str, Any]]:
    """{group: {field: default}} of the config dataclasses (a factory's value called)."""
    return {g: {f.name: field_default(f) for f in dataclasses.fields(c)} for g, c in groups.items()}


def value_sources(
    resolved: dict[str, dict[str, Any]],
    parsed: dict[str, dict[str, Any]],
    sources: dict[str, str],
    default: dict[str, dict[str, Any]],
    resolved_by: dict[str, str],
) -> list[tuple[str, Any, str]]:
    """[(section.field, value, where it came from)] for every recipe value that is not its
    field's default. ``parsed``: the values as the command line and recipe gave them;
    ``resolved_by``: {section.field: "checkpoint C" ...} for values resolution replaced; a value
    the flags left unset and resolution filled in is the DeepSpeed JSON's."""
    out = []
    for section, values in recipe_dict(resolved).items():
        group = SECTIONS[section]
        for key, value in values.items():
            name = f"{section}.{key}"
            given = (parsed.get(group) or {}).get(key)
            if name in resolved_by:
                where = resolved_by[name]
            elif _norm(value) != _norm(given) and given is None:
                where = f"DeepSpeed JSON {resolved['run']['ds_config']}"
            elif _norm(value) != _norm(given):
                where = "resolved (--init_from or the shards)"
            elif name in sources:
                where = sources[name]
            else:
                continue
            if _norm(value) != _norm((default.get(group) or {}).get(key)) or name in sources:
                out.append((name, value, where))
    return out


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def resolved_flags(cfg: TrainConfig, setup: DeepSpeedSetup) -> dict[str, Any]:
    """``cfg.to_dict()`` with the values the DeepSpeed config decided filled in where the flags
    left them unset (batch sizes, optimizer, lr, weight decay, clipping, precision)."""
    out = cfg.to_dict()
    ds, plan = setup.config, setup.batch
    params = ds.get("optimizer", {}).get("params", {})
    filled = {
        "batch": {
            "global_batch_size": plan.global_batch,
            "micro_batch_size": plan.micro_batch,
            "grad_accum": plan.grad_accum,
        },
        "optim": {
            "optimizer": ds.get("optimizer", {}).get("type"),
            "lr": params.get("lr"),
            "weight_decay": params.get("weight_decay"),
            "gradient_clipping": ds.get("gradient_clipping"),
        },
        "precision": {"precision": setup.precision},
        "memory": {"activation_checkpointing": setup.activation_checkpointing},
    }
    for concern, values in filled.items():
        section = out.get(concern, {})
        for key, value in values.items():
            if section.get(key) is None:
                section[key] = value
    return out


def resolved_recipe(cfg: TrainConfig, setup: DeepSpeedSetup) -> str:
    """RUN/recipe.yaml: every setting as this launch resolved it (defaults filled in, values the
    DeepSpeed JSON gives left to it), which reproduces the run with the same JSON:
    ``--recipe RUN/recipe.yaml --output_dir NEW``."""
    header = (
        "The resolved recipe of this run, written by pretrain/main.py. Reproduce the run with\n"
        "  bertforge train --recipe THIS_FILE --output_dir NEW_RUN"
    )
    values = resolved_flags(cfg, setup)
    given = cfg.to_dict()
    # A value the DeepSpeed JSON gave stays there (the recipe names the JSON): written here too,
    # it would be given twice. The batch sizes are one group: the JSON's share of them derives
    # the rest at the run's world size.
    batch_from_json = any(f.startswith("batch.") for f in setup.from_json)
    for name in setup.from_json | (
        {f"batch.{k}" for k in given["batch"]} if batch_from_json else set()
    ):
        section, key = name.split(".")
        values[section][key] = given[section][key]
    kind = str(values["optim"].get("optimizer") or "").lower()
    # --optimizer names adamw or lamb; another type stays the DeepSpeed JSON's own
    values["optim"]["optimizer"] = kind if kind in ("adamw", "lamb") else None
    return dump_recipe(values, header)
