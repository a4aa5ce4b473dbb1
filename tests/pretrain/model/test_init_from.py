"""--init_from: weights from transformers' own folders and from our runs, vocabulary extension,
and the errors a user meets (pretrain/model/init_from.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers.commands import DATA
from helpers.vocab import extend_with_domain_terms, vocab_with_unused
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForPreTraining, BertModel

from bertforge.data_prep.sample_corpus import pydoc_documents
from bertforge.data_prep.tokenizer import import_tokenizer, train_wordpiece
from bertforge.pretrain.data.masking import IGNORE_INDEX
from bertforge.pretrain.model.bert import padded_vocab
from bertforge.pretrain.model.init_from import load_initial_weights
from bertforge.pretrain.model.init_source import InitError, init_model_config, read_init_config
from bertforge.pretrain.model.registry import PRESETS, build_model

ARCH = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


@pytest.fixture(scope="module")
def base_tokenizer(tmp_path_factory) -> Path:
    """An uncased WordPiece tokenizer of English and Chinese text with BERT's [unused*] slots."""
    root = tmp_path_factory.mktemp("base_tok")
    docs = pydoc_documents()[:40] + (DATA / "zh_hongloumeng_sample.txt").read_text().splitlines()
    train_wordpiece(docs, 1200, True, root / "trained")
    vocab = vocab_with_unused(root / "trained", root / "vocab.txt")
    import_tokenizer(vocab, True, root / "hf")
    return root / "hf"


def _shards_tokenizer(source: Path, dest: Path) -> Path:
    """What `data_prep build --tokenizer source` puts into SHARDS/tokenizer."""
    import_tokenizer(source, None, dest)
    return dest


def _hf_folder(tmp: Path, cls, tokenizer: Path, safe: bool = True, **arch) -> tuple[Path, object]:
    torch.manual_seed(1)
    n = len(AutoTokenizer.from_pretrained(str(tokenizer)))
    model = cls(BertConfig(vocab_size=n, **{**ARCH, **arch})).eval()
    with torch.no_grad():  # non-zero biases, so a bias that is not loaded shows in the loss
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    folder = tmp / f"{cls.__name__}_{'st' if safe else 'bin'}"
    model.save_pretrained(str(folder))
    if not safe:  # transformers 5 writes safetensors only; older versions wrote this file
        from safetensors.torch import load_file

        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    AutoTokenizer.from_pretrained(str(tokenizer)).save_pretrained(str(folder))
    return folder, model


def _our_model(folder: Path, shards_tok: Path, nsp: bool, max_seq_len: int = 64):
    cfg = init_model_config(
        folder, dataclasses.replace(PRESETS["tiny"], loss_impl="torch"), {}, max_seq_len=max_seq_len
    )
    vocab = len(AutoTokenizer.from_pretrained(str(shards_tok)))
    torch.manual_seed(0)
    model = build_model(cfg, vocab, nsp=nsp, max_seq_len=max_seq_len).eval()
    report = load_initial_weights(
        model, folder, tokenizer_dir_of_shards=shards_tok, max_seq_len=max_seq_len
    )
    return model, report


def _batch(vocab: int, nsp: bool = False, n: int = 4, length: int = 24) -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, vocab, (n, length), generator=g)
    attn = torch.ones(n, length, dtype=torch.long)
    attn[1, 15:] = 0
    labels = torch.full((n, length), IGNORE_INDEX)
    pick = torch.rand(n, length, generator=g) < 0.2
    pick[:, 0] = True
    labels[pick] = ids[pick]
    ids = ids.masked_fill(pick, 4)
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "token_type_ids": torch.zeros_like(ids),
        "labels": labels,
    }
    if nsp:
        batch["next_sentence_label"] = torch.tensor([0, 1, 1, 0])
    return batch


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin", "prefixed_gamma_beta"])
def test_masked_lm_folder_gives_transformers_loss(base_tokenizer, tmp_path, layout):
    folder, hf = _hf_folder(
        tmp_path, BertForMaskedLM, base_tokenizer, safe=layout in ("safetensors", "sharded")
    )
    if layout == "sharded":  # several files and an index, as large checkpoints come
        for f in folder.glob("model*.safetensors*"):
            f.unlink()
        hf.save_pretrained(str(folder), max_shard_size="100KB")
        assert (folder / "model.safetensors.index.json").is_file()
    if layout == "prefixed_gamma_beta":  # a Lightning-style prefix and old TF-converted names
        sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
        renamed = {
            "model."
            + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            ): v
            for k, v in sd.items()
        }
        torch.save(renamed, folder / "pytorch_model.bin")
    shards_tok = _shards_tokenizer(folder, tmp_path / "shards_tok")
    model, report = _our_model(folder, shards_tok, nsp=False)
    batch = _batch(model.true_vocab_size)
    with torch.no_grad():
        ours = model(**batch)["mlm_loss"]
        ref = hf(**batch).loss
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert report.newly_initialised == [] and report.vocabulary["relation"] == "identical"
    assert "cls.predictions.bias" in report.loaded
    assert model.config.vocab_size % 8 == 0


def test_pretraining_folder_loads_the_nsp_head(base_tokenizer, tmp_path):
    folder, hf = _hf_folder(tmp_path, BertForPreTraining, base_tokenizer)
    model, report = _our_model(folder, _shards_tokenizer(folder, tmp_path / "tok"), nsp=True)
    batch = _batch(model.true_vocab_size, nsp=True)
    with torch.no_grad():
        ours = model(**batch)
        ref = hf(**batch)
    torch.testing.assert_close(ours["loss"], ref.loss, rtol=1e-6, atol=1e-6)
    assert {"cls.seq_relationship.weight", "bert.pooler.dense.weight"} <= set(report.loaded)
    assert report.newly_initialised == []


def test_bare_bert_model_reports_heads_as_new(base_tokenizer, tmp_path):
    folder, hf = _hf_folder(tmp_path, BertModel, base_tokenizer)
    model, report = _our_model(folder, _shards_tokenizer(folder, tmp_path / "tok"), nsp=True)
    assert set(report.newly_initialised) == {
        "cls.predictions.bias",
        "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    }
    batch = _batch(model.true_vocab_size)
    with torch.no_grad():
        ours = model.bert(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        ref = hf(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_extended_vocabulary_rows(base_tokenizer, tmp_path):
    from safetensors.torch import load_file

    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    ext = extend_with_domain_terms(folder, tmp_path)
    model, report = _our_model(folder, _shards_tokenizer(ext, tmp_path / "tok"), nsp=False)
    src = load_file(str(folder / "model.safetensors"))
    emb, bias = src["bert.embeddings.word_embeddings.weight"], src["cls.predictions.bias"]
    base, new = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(ext))
    new_ids = sorted(
        i
        for i in range(len(new))
        if i >= len(base) or base.convert_ids_to_tokens(i) != new.convert_ids_to_tokens(i)
    )
    unused = [i for i in range(len(base)) if base.convert_ids_to_tokens(i).startswith("[unused")]
    assert len(new_ids) == 12 and new_ids[: len(unused)] == unused  # [unused*] slots first
    ours_emb = model.bert.embeddings.word_embeddings.weight.detach()
    ours_bias = model.cls.predictions.bias.detach()
    old = [i for i in range(len(base)) if i not in new_ids]
    assert torch.equal(ours_emb[old], emb[old]) and torch.equal(ours_bias[old], bias[old])
    for i in new_ids:
        pieces = base(new.convert_ids_to_tokens(i), add_special_tokens=False)["input_ids"]
        assert len(pieces) >= 2
        torch.testing.assert_close(ours_emb[i], emb[pieces].mean(0), rtol=0, atol=0)
        torch.testing.assert_close(ours_bias[i], bias[pieces].mean(0), rtol=0, atol=0)
    assert model.config.vocab_size == padded_vocab(len(new), 8)
    v = report.vocabulary
    assert v["relation"] == "extension" and v["new_count"] == 12
    assert v["unused_slots_filled"] == len(unused) and v["appended"] == 12 - len(unused)
    heart = next(t for t in v["new_tokens"] if t["token"] == "heart failure")
    assert heart["pieces"] == base.tokenize("heart failure")


def test_missing_or_non_bert_checkpoint(base_tokenizer, tmp_path):
    with pytest.raises(InitError, match="no such file or folder"):
        read_init_config(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InitError, match="not a BERT checkpoint"):
        read_init_config(tmp_path / "empty")
    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "roberta"}))
    with pytest.raises(InitError, match="model_type 'roberta'"):
        read_init_config(folder)


def test_config_disagreeing_with_flags_lists_every_difference(base_tokenizer, tmp_path):
    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    with pytest.raises(InitError) as e:
        init_model_config(
            folder,
            PRESETS["tiny"],
            {
                "hidden_size": 128,
                "num_hidden_layers": 2,
                "intermediate_size": 512,
                "hidden_dropout_prob": 0.0,
            },
        )
    msg = str(e.value)
    assert "hidden_size: checkpoint 32, flags 128" in msg
    assert "intermediate_size: checkpoint 64, flags 512" in msg
    assert "num_hidden_layers" not in msg and "dropout" not in msg  # agreeing / free fields
    cfg = init_model_config(folder, PRESETS["tiny"], {"hidden_dropout_prob": 0.0})
    assert cfg.hidden_size == 32 and cfg.hidden_dropout_prob == 0.0


def test_shards_of_an_unrelated_tokenizer_are_refused(base_tokenizer, tmp_path):
    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    train_wordpiece(pydoc_documents()[40:], 1300, True, tmp_path / "other")
    with pytest.raises(
        InitError, match=r"neither the checkpoint's tokenizer.*\n  id \d+: checkpoint"
    ):
        _our_model(folder, _shards_tokenizer(tmp_path / "other", tmp_path / "tok"), nsp=False)


def test_position_embeddings_shorter_than_the_shards(base_tokenizer, tmp_path):
    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer, max_position_embeddings=64)
    tok = _shards_tokenizer(folder, tmp_path / "tok")
    with pytest.raises(InitError, match="cover 64 positions, but the shards' max_seq_len is 128"):
        _our_model(folder, tok, nsp=False, max_seq_len=128)
    model = build_model(
        dataclasses.replace(PRESETS["tiny"], **ARCH), len(AutoTokenizer.from_pretrained(str(tok)))
    )  # built without the config check
    with pytest.raises(InitError, match="cover 64 positions"):
        load_initial_weights(model, folder, tokenizer_dir_of_shards=tok, max_seq_len=128)


def test_extension_of_another_base_is_refused(base_tokenizer, tmp_path):
    folder, _ = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    train_wordpiece(pydoc_documents()[40:], 1300, True, tmp_path / "other")
    ext = extend_with_domain_terms(tmp_path / "other", tmp_path)
    with pytest.raises(InitError, match="neither the checkpoint's tokenizer"):
        _our_model(folder, _shards_tokenizer(ext, tmp_path / "tok"), nsp=False)


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def own_run(request, english_shards, tmp_path_factory) -> Path:
    """One optimizer step of our trainer (one process) under ZeRO-2 or ZeRO-3, saved."""
    import subprocess
    import sys

    from helpers.commands import REPO

    tmp = tmp_path_factory.mktemp(f"run_zero{request.param}")
    cfg = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    cfg["zero_optimization"] = {"stage": request.param, "overlap_comm": False}
    (tmp / "ds.json").write_text(json.dumps(cfg))
    run = tmp / "run"
    cmd = [
        sys.executable,
        "pretrain/main.py",
        "--ds_config",
        str(tmp / "ds.json"),
        "--data",
        str(english_shards),
        "--output_dir",
        str(run),
        "--max_steps",
        "1",
        "--model",
        "tiny",
        "--num_workers",
        "0",
        "--progress",
        "false",
        "--global_batch_size",
        "4",
        "--micro_batch_size",
        "4",
        "--eval_batches",
        "1",
        "--hidden_size",
        "64",
        "--intermediate_size",
        "128",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


def test_own_checkpoint_weights_equal_the_source(own_run, english_shards):
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict, find_latest

    ckpt = find_latest(own_run / "checkpoints")
    source = consolidated_state_dict(ckpt)
    for path in (own_run, ckpt):  # a run folder or one step_N folder
        fields, tok_dir = read_init_config(path)
        assert fields["hidden_size"] == 64 and tok_dir == own_run / "tokenizer"
        model, report = _our_model(path, english_shards / "tokenizer", nsp=False, max_seq_len=128)
        assert report.kind == "run" and report.newly_initialised == [] and report.ignored == []
        for key, value in model.state_dict().items():
            if key in source:
                assert torch.equal(value, source[key].float()), key


@pytest.mark.parametrize("own_run", [2], ids=["zero2"], indirect=True)
def test_export_then_init_from_gives_identical_logits(own_run, english_shards, tmp_path):
    from bertforge.pretrain.export.hf_export import export

    export(own_run, tmp_path / "hf", verify=False)
    model, report = _our_model(
        tmp_path / "hf", english_shards / "tokenizer", nsp=False, max_seq_len=128
    )
    assert report.kind == "hf" and report.vocabulary["relation"] == "identical"
    hf = BertForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    batch = _batch(model.true_vocab_size)
    with torch.no_grad():
        ours = model.predict_masked(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"]
        )
        ref = hf(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    torch.testing.assert_close(ours, ref[batch["labels"] != IGNORE_INDEX], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("own_run", [2], ids=["zero2"], indirect=True)
def test_an_export_that_fails_its_check_publishes_nothing(own_run, tmp_path, monkeypatch):
    from bertforge.pretrain.export import hf_export
    from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

    def broken(out, nsp, **_):
        raise CheckpointError(f"exported folder {out} does not load cleanly")

    monkeypatch.setattr(hf_export, "verify_export", broken)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "earlier_export.txt").write_text("kept")
    with pytest.raises(CheckpointError, match="does not load cleanly"):
        hf_export.export(own_run, out)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left
    assert [p.name for p in out.iterdir()] == ["earlier_export.txt"]


_ZERO3_SCRIPT = """
import os, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
import dataclasses, torch, deepspeed
from safetensors.torch import load_file
from bertforge.pretrain.model.init_from import load_initial_weights
from bertforge.pretrain.model.init_source import init_model_config
from bertforge.pretrain.model.registry import PRESETS, build_model
folder, vocab = sys.argv[1], int(sys.argv[2])
deepspeed.init_distributed("gloo")
model = build_model(init_model_config(folder, PRESETS["tiny"], {}), vocab)
deepspeed.zero.Init(module=model, config_dict_or_path={"zero_optimization": {"stage": 3},
                                                       "train_batch_size": 1})
assert all(p.numel() == 0 for p in model.parameters())  # partitioned: nothing held locally
load_initial_weights(model, folder, tokenizer_dir_of_shards=folder)
src = load_file(folder + "/model.safetensors")
with deepspeed.zero.GatheredParameters(list(model.parameters())):
    for key, value in model.state_dict().items():
        if key in src:
            assert torch.equal(value[:len(src[key])], src[key]), key
print("equal")
"""


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_load_into_a_zero3_partitioned_module(base_tokenizer, tmp_path):
    """Parameters ZeRO-3 already partitioned (zero.Init) are gathered, loaded and re-partitioned."""
    import subprocess
    import sys

    from helpers.commands import REPO

    folder, hf = _hf_folder(tmp_path, BertForMaskedLM, base_tokenizer)
    proc = subprocess.run(
        [sys.executable, "-c", _ZERO3_SCRIPT, str(folder), str(hf.config.vocab_size)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 and "equal" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )


def test_new_continuation_piece_is_split_into_continuation_pieces(base_tokenizer, tmp_path):
    """A hand-made extension may append `##` pieces: their rows come from `##` pieces."""
    from bertforge.pretrain.model.init_from import plan_vocabulary

    spec = json.loads((base_tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    new_id = len(vocab)
    vocab["##ologyx"] = new_id
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    plan = plan_vocabulary(base_tokenizer, tmp_path / "ext")
    assert plan.relation == "extension" and list(plan.pieces) == [new_id]
    base = AutoTokenizer.from_pretrained(str(base_tokenizer))
    pieces = base.convert_ids_to_tokens(plan.pieces[new_id])
    assert len(pieces) >= 2 and all(p.startswith("##") for p in pieces)
    assert "".join(p[2:] for p in pieces) == "ologyx"


def _sentence_transformers_folder(tmp: Path, tokenizer: Path, module: str) -> tuple[Path, object]:
    """A bare BertModel as sentence-transformers publishes it: modules.json, 1_Pooling/ and a
    tokenizer.json with truncation and padding on, the encoder at the top or in ``module``/."""
    root = tmp / f"st_{module or 'top'}"
    folder = root / module if module else root
    folder.parent.mkdir(parents=True, exist_ok=True)
    enc, hf = _hf_folder(tmp, BertModel, tokenizer)
    enc.rename(folder)
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tok["truncation"] = {
        "direction": "Right",
        "max_length": 16,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    tok["padding"] = {
        "strategy": {"Fixed": 16},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    modules = [
        {"idx": 0, "name": "0", "path": module, "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (root / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return root, hf


@pytest.mark.parametrize("module", ["", "0_Transformer"])
def test_sentence_transformers_folder_loads_the_encoder_and_says_what_it_drops(
    base_tokenizer, tmp_path, module, capsys
):
    from bertforge.pretrain.export.model_card import _initial_weights

    folder, hf = _sentence_transformers_folder(tmp_path, base_tokenizer, module)
    shards_tok = _shards_tokenizer(folder / module, tmp_path / "tok")
    capsys.readouterr()
    model, report = _our_model(folder, shards_tok, nsp=False)
    # the published file's truncation and padding: turned off, and said once
    assert capsys.readouterr().out.count("turned off for the vocabulary check") == 1
    assert report.kind == "sentence-transformers"
    assert {k for k in report.ignored if k.startswith("bert.pooler.")} == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
    }
    assert any("pooler" in n and "dropped" in n for n in report.notes)
    assert any("sentence-transformers" in n for n in report.notes)
    batch = _batch(model.true_vocab_size)
    with torch.no_grad():
        ours = model.bert(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        ref = hf(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    # the export's model card says which weights came from the source and which were new
    card = "\n".join(_initial_weights({"init_from": report.to_dict()}))
    assert f"{len(report.loaded)} tensors loaded" in card
    assert "newly initialised: 5 (cls.predictions." in card
    assert "bert.pooler.dense.weight" in card and "sentence-transformers" in card
