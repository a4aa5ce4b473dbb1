"""The model registry (pretrain/model/registry.py, specs.py): each registered arch's spec agrees
with the model it builds (names its adapter loads, the transformers class it exports to), the
objectives match what the trainer logs, and no product file outside the model package names an
architecture (issue 35: a third arch is a folder plus one line in the registry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.registry import (
    ARCHES,
    DEFAULT_PRESET,
    PRESETS,
    ArchError,
    build_model,
    check_supported,
    get_spec,
    spec_for_model_type,
)
from bertforge.pretrain.model.specs import (
    MLM,
    MLM_NSP,
    OBJECTIVES,
    ObjectiveError,
    objective_for_format,
    resolve_objective,
)

REPO = Path(__file__).resolve().parents[3]
VOCAB = 1999


def test_every_preset_belongs_to_one_registered_arch():
    assert sum(len(s.presets) for s in ARCHES.values()) == len(PRESETS)  # no name twice
    for name, spec in ARCHES.items():
        assert spec.name == name and DEFAULT_PRESET[name] in spec.presets
        assert {p.arch for p in spec.presets.values()} == {name}
        assert spec.default_attention in ("full", "document")
        assert set(spec.objectives) <= set(OBJECTIVES)


@pytest.mark.parametrize("arch", list(ARCHES))
def test_the_adapter_names_the_built_models_tensors(arch):
    """The keys --init_from loads specially exist in the model, and the exported config is of a
    model_type the same adapter reads back."""
    spec = get_spec(arch)
    with torch.device("meta"):
        model = build_model(PRESETS[spec.default_preset], VOCAB)
    keys = set(model.state_dict())
    adapter = spec.adapter
    assert model.arch == arch
    assert {adapter.word_emb, adapter.mlm_bias, *adapter.tied, *adapter.tied.values()} <= keys
    assert adapter.pos_emb is None if spec.rotary else adapter.pos_emb in keys
    assert model.hf_config().model_type in adapter.model_types
    assert spec_for_model_type(model.hf_config().model_type) is spec
    shape_terms = spec.memory_terms(PRESETS[spec.default_preset])
    assert isinstance(shape_terms, dict)


def test_unknown_names_are_refused_listing_the_choices():
    with pytest.raises(ArchError, match="choose one of bert, modernbert"):
        get_spec("electra")
    assert spec_for_model_type("roberta") is None


def test_the_data_format_picks_the_objective_and_its_head():
    assert objective_for_format("packed") is MLM and objective_for_format("nsp") is MLM_NSP
    with pytest.raises(ValueError, match="shard format 'lines'"):
        objective_for_format("lines")
    with torch.device("meta"):
        assert build_model(PRESETS["tiny"], VOCAB, objective=MLM_NSP).nsp
        assert not build_model(PRESETS["tiny"], VOCAB, objective=MLM).nsp
    with pytest.raises(ValueError, match="contradicts objective 'mlm'"):
        build_model(PRESETS["tiny"], VOCAB, nsp=True, objective=MLM)


def test_sentence_order_is_chosen_on_pair_shards_and_trained_by_bert_only():
    sop = resolve_objective(ObjectiveConfig(objective="mlm+sop"), "nsp")
    assert sop.name == "mlm+sop" and sop.sentence_order and sop.pair_head and not sop.nsp
    assert objective_for_format("nsp") is MLM_NSP  # auto stays BERT's NSP
    with pytest.raises(ObjectiveError, match="build them with `bertforge prep build --format nsp`"):
        resolve_objective(ObjectiveConfig(objective="mlm+sop"), "packed")
    with torch.device("meta"):  # BERT's pooler and pair classifier carry SOP
        model = build_model(PRESETS["tiny"], VOCAB, objective=sop)
    assert model.hf_architecture == "BertForPreTraining"
    modern = PRESETS["modernbert-tiny"]
    with pytest.raises(ArchError, match="--objective mlm\\+sop: ModernBERT trains mlm, rtd"):
        check_supported(modern, sop)


@pytest.mark.parametrize("objective", list(OBJECTIVES.values()), ids=list(OBJECTIVES))
def test_an_objectives_metrics_are_what_the_trainer_logs(objective):
    """Every registered objective, a new one included: its step sums make the step record hold
    exactly its spec's metrics."""
    from bertforge.pretrain.components.step_records import STEP_SUMS, loss_record
    from bertforge.pretrain.objectives.registry import objective_for

    sums = dict.fromkeys(STEP_SUMS, 0.0) | {"mlm_loss": 2.0, "mlm_correct": 3.0}
    sums |= dict.fromkeys(objective_for(objective).step_sums, 4.0)
    assert set(loss_record(sums, 10.0, 1)) == set(objective.metrics)
    assert {f"{h}_loss" for h in objective.heads} == set(objective.loss_terms)


def test_no_product_file_outside_the_model_package_names_an_architecture():
    """The issue's check (grep -rln "modernbert\\|ModernBert" ... | grep -v pretrain/model/): prose
    may say "ModernBERT", code asks the registry."""
    names = re.compile(r"modernbert|ModernBert")
    found = [
        str(f.relative_to(REPO))
        for package in ("pretrain", "data_prep", "kernels", "bertforge")
        for f in (REPO / package).rglob("*.py")
        if not f.relative_to(REPO).as_posix().startswith("pretrain/model/")
        and names.search(f.read_text(encoding="utf-8"))
    ]
    assert not found, f"these name an architecture; ask pretrain.model.registry instead: {found}"


def test_the_command_line_imports_no_modeling_code():
    """The flags, the registry and the doctor's CLI read every arch through its spec and arch.py;
    transformers' modeling modules (seconds of imports: torch._dynamo, DTensor) load only when a
    model is built, so a misspelt flag or --help answers without them (the auto classes' name
    tables are not modeling code)."""
    import subprocess
    import sys

    probe = (
        "import sys, bertforge.pretrain.config.cli, bertforge.pretrain.doctor.cli\n"
        "from bertforge.pretrain.model.registry import ARCHES, PRESETS\n"
        "heavy = ('.bert.model', '.modernbert.model', '.attention_paths')\n"
        "print([m for m in sys.modules if m.startswith('transformers.models.') and '.modeling_'"
        " in m and '.auto.' not in m or m.endswith(heavy)])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[]", out
