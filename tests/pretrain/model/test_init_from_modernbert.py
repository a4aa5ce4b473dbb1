"""--init_from a transformers ModernBERT folder (pretrain/model/init_source.py, init_from.py): the
tensors load bit for bit, the masked-row logits and loss equal transformers' own
ModernBertForMaskedLM's, a bare ModernBertModel loads its encoder, the vocabulary extension's
new rows are the mean of their pieces, a context extension is reported, and what our block cannot
hold (biases, an untied decoder, another arch) is refused naming the key or both archs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_bert import build_tiny_bert, build_tiny_modernbert
from helpers.vocab import extend_with_domain_terms
from safetensors.torch import load_file
from transformers import AutoTokenizer, ModernBertForMaskedLM

from bertforge.data_prep.tokenizer import import_tokenizer
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.model.bert import padded_vocab
from bertforge.pretrain.model.init_from import load_initial_weights
from bertforge.pretrain.model.init_source import InitError, init_model_config, read_init_config
from bertforge.pretrain.model.registry import PRESETS, build_model

EMB, BIAS = "model.embeddings.tok_embeddings.weight", "decoder.bias"
BASE = dataclasses.replace(PRESETS["modernbert-tiny"], loss_impl="torch")
RUN_FLAGS = {"arch": "modernbert"}  # what `--arch modernbert` puts into explicit_model


@pytest.fixture(scope="module")
def mb_folder(tmp_path_factory) -> Path:
    """transformers' ModernBertForMaskedLM (3 layers, 8-token window) with its tokenizer; its
    norms and decoder bias are moved off their initial 1 and 0, so a tensor not loaded shows, and
    its attention weights enlarged, so that the scores (hence the rotary thetas and the window)
    matter: at the initial std 0.02 attention is near uniform."""
    folder = build_tiny_modernbert(tmp_path_factory.mktemp("mb") / "hf")
    model = ModernBertForMaskedLM.from_pretrained(str(folder))
    torch.manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name == BIAS:
                p.add_(torch.randn_like(p) * 0.3)
            if name.endswith("Wqkv.weight"):
                p.normal_(0, 0.4)
    model.save_pretrained(str(folder))
    return folder


def _shards_tokenizer(source: Path, dest: Path) -> Path:
    """What `data_prep build --tokenizer source` puts into SHARDS/tokenizer."""
    import_tokenizer(source, None, dest)
    return dest


def _our_model(folder: Path, shards_tok: Path, max_seq_len: int = 64, explicit=None):
    cfg = init_model_config(folder, BASE, explicit or RUN_FLAGS, max_seq_len=max_seq_len)
    vocab = len(AutoTokenizer.from_pretrained(str(shards_tok)))
    torch.manual_seed(0)
    model = build_model(cfg, vocab, max_seq_len=max_seq_len).eval()
    report = load_initial_weights(
        model, folder, tokenizer_dir_of_shards=shards_tok, max_seq_len=max_seq_len
    )
    return model, report


def _batch(vocab: int, mask_id: int, n: int = 3, length: int = 40):
    """Ids, attention mask (row 1 padded after 25) and labels at ~20% of the attended tokens:
    longer than the 8-token window, so the local layers' window matters."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, vocab, (n, length), generator=g)
    attn = torch.ones(n, length, dtype=torch.long)
    attn[1, 25:] = 0
    pick = (torch.rand(n, length, generator=g) < 0.2) & attn.bool()
    pick[:, 1] = True
    labels = torch.full((n, length), IGNORE_INDEX).masked_scatter(pick, ids[pick])
    return ids.masked_fill(pick, mask_id), attn, labels


def test_masked_lm_folder_loads_exactly_and_gives_transformers_logits(mb_folder, tmp_path):
    from bertforge.pretrain.export.model_card import _initial_weights

    model, report = _our_model(mb_folder, _shards_tokenizer(mb_folder, tmp_path / "tok"))
    src = load_file(str(mb_folder / "model.safetensors"))
    ours = model.state_dict()
    for key, value in src.items():  # every tensor of the file, bit for bit
        assert torch.equal(ours[key][: value.shape[0]], value), key
    assert sorted(report.loaded) == sorted(src)
    assert report.newly_initialised == [] and report.ignored == []
    assert report.vocabulary["relation"] == "identical" and report.kind == "hf"
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight  # tied
    assert model.config.vocab_size == padded_vocab(model.true_vocab_size, 64)

    hf = ModernBertForMaskedLM.from_pretrained(str(mb_folder)).eval()
    mask_id = AutoTokenizer.from_pretrained(str(mb_folder)).mask_token_id
    ids, attn, labels = _batch(model.true_vocab_size, mask_id)
    with torch.no_grad():
        got = model.predict_masked(ids, attn, None, labels)
        out = hf(input_ids=ids, attention_mask=attn, labels=labels)
        loss = model(ids, attn, labels=labels)["mlm_loss"]
    want = out.logits[labels != IGNORE_INDEX]
    assert got.shape == want.shape and got.shape[0] == int((labels != IGNORE_INDEX).sum())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(loss) == pytest.approx(float(out.loss), rel=1e-5)
    # the summary and the export's model card say what loaded
    assert f"{len(src)} tensors loaded, 0 newly initialised" in report.summary()
    card = "\n".join(_initial_weights({"init_from": report.to_dict()}))
    assert f"{len(src)} tensors loaded" in card and "newly initialised: 0" in card


def test_bare_modernbert_model_loads_the_encoder_and_reports_the_head(mb_folder, tmp_path):
    hf = ModernBertForMaskedLM.from_pretrained(str(mb_folder)).eval()
    bare = tmp_path / "bare"
    hf.model.save_pretrained(str(bare))  # keys without the "model." prefix
    AutoTokenizer.from_pretrained(str(mb_folder)).save_pretrained(str(bare))
    assert not any(k.startswith("model.") for k in load_file(str(bare / "model.safetensors")))
    model, report = _our_model(bare, _shards_tokenizer(bare, tmp_path / "tok"))
    assert set(report.newly_initialised) == {"head.dense.weight", "head.norm.weight", BIAS}
    assert report.ignored == [] and "3 newly initialised" in report.summary()
    ids, attn, _ = _batch(model.true_vocab_size, 4)
    with torch.no_grad():
        got = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
        want = hf.model(input_ids=ids, attention_mask=attn).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_extended_vocabulary_rows_are_the_mean_of_their_pieces(mb_folder, tmp_path):
    ext = extend_with_domain_terms(mb_folder, tmp_path)
    model, report = _our_model(mb_folder, _shards_tokenizer(ext, tmp_path / "tok"))
    src = load_file(str(mb_folder / "model.safetensors"))
    emb, bias = src[EMB], src[BIAS]
    base = AutoTokenizer.from_pretrained(str(mb_folder))
    new = AutoTokenizer.from_pretrained(str(ext))
    new_ids = [
        i
        for i in range(len(new))
        if i >= len(base) or base.convert_ids_to_tokens(i) != new.convert_ids_to_tokens(i)
    ]
    assert 3 <= len(new_ids) <= 12  # the three terms at least
    ours_emb = model.model.embeddings.tok_embeddings.weight.detach()
    ours_bias = model.decoder.bias.detach()
    old = [i for i in range(len(base)) if i not in new_ids]
    assert torch.equal(ours_emb[old], emb[old]) and torch.equal(ours_bias[old], bias[old])
    for i in new_ids:
        pieces = base(new.convert_ids_to_tokens(i), add_special_tokens=False)["input_ids"]
        assert len(pieces) >= 2
        torch.testing.assert_close(ours_emb[i], emb[pieces].mean(0), rtol=0, atol=1e-7)
        torch.testing.assert_close(ours_bias[i], bias[pieces].mean(0), rtol=0, atol=1e-7)
    assert torch.equal(model.decoder.weight[new_ids], ours_emb[new_ids])  # the tied decoder
    assert model.true_vocab_size == len(new)
    v = report.vocabulary
    assert v["relation"] == "extension" and v["new_count"] == len(new_ids)
    assert "heart failure" in [t["token"] for t in v["new_tokens"]]
    assert EMB in report.loaded and BIAS in report.loaded


def test_context_extension_and_rope_theta_flags_are_kept_and_reported(mb_folder, tmp_path):
    fields, _ = read_init_config(mb_folder)
    assert fields["max_position_embeddings"] == 256 and fields["global_attn_every_n_layers"] == 3
    flags = {**RUN_FLAGS, "global_rope_theta": 320000.0}
    model, report = _our_model(
        mb_folder, _shards_tokenizer(mb_folder, tmp_path / "tok"), max_seq_len=512, explicit=flags
    )
    assert model.config.max_position_embeddings == 512
    assert model.global_rope_theta() == 320000.0  # the flag, over the checkpoint's 160000
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    notes = "\n".join(report.notes)
    assert "context extension" in notes and "256, this run's 512" in notes
    assert "global_rope_theta 320000 (this run's flags) instead of the checkpoint's 160000" in notes
    assert "local_rope_theta" not in notes
    with pytest.raises(InitError, match="local_attention: checkpoint 8, flags 128"):
        init_model_config(mb_folder, BASE, {**RUN_FLAGS, "local_attention": 128})


def _config_only(tmp: Path, source: Path, **changes) -> Path:
    folder = tmp / "cfg"
    folder.mkdir()
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_legacy_config_keys_map_to_our_fields(mb_folder, tmp_path):
    """A config.json as ModernBERT was first published: global/local_rope_theta and
    global_attn_every_n_layers instead of rope_parameters and layer_types."""
    config = json.loads((mb_folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        config.pop(key, None)
    legacy = {
        "global_rope_theta": 80000.0,
        "local_rope_theta": 5000.0,
        "global_attn_every_n_layers": 2,
        "num_hidden_layers": 4,
        "hidden_activation": "gelu_new",
        "norm_eps": 1e-6,
    }
    folder = tmp_path / "legacy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, **legacy}))
    (folder / "model.safetensors").write_bytes(b"")  # only the config is read here
    fields, _ = read_init_config(folder)
    assert fields["arch"] == "modernbert"
    assert fields["global_rope_theta"] == 80000.0 and fields["local_rope_theta"] == 5000.0
    assert fields["global_attn_every_n_layers"] == 2 and fields["num_hidden_layers"] == 4
    assert fields["hidden_act"] == "gelu_new" and fields["layer_norm_eps"] == 1e-6
    assert fields["local_attention"] == 8 and fields["max_position_embeddings"] == 256


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("norm_bias", True),
        ("attention_bias", True),
        ("mlp_bias", True),
        ("classifier_bias", True),
        ("tie_word_embeddings", False),
    ],
)
def test_what_our_block_cannot_hold_is_refused_naming_the_key(mb_folder, tmp_path, key, value):
    folder = _config_only(tmp_path, mb_folder, **{key: value})
    with pytest.raises(InitError, match=rf"cannot hold:\n  {key}: {value!r}"):
        read_init_config(folder)


def test_an_irregular_layer_pattern_is_refused(mb_folder, tmp_path):
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    folder = _config_only(tmp_path, mb_folder, layer_types=types)
    with pytest.raises(InitError, match="layer_types: "):
        read_init_config(folder)


def test_another_arch_is_refused_naming_both(mb_folder, tmp_path):
    msg = r"is a ModernBERT checkpoint \(--arch modernbert\), but this run is --arch bert"
    with pytest.raises(InitError, match=msg):  # --arch bert given
        init_model_config(mb_folder, PRESETS["tiny"], {"arch": "bert"})
    with pytest.raises(InitError, match=msg):  # --model tiny: a BERT preset
        init_model_config(mb_folder, PRESETS["tiny"], dataclasses.asdict(PRESETS["tiny"]))
    bert_model = build_model(PRESETS["tiny"], 3000)  # built without the config check
    with pytest.raises(InitError, match=msg):
        load_initial_weights(bert_model, mb_folder, tokenizer_dir_of_shards=mb_folder)
    bert = build_tiny_bert(tmp_path / "bert")
    with pytest.raises(InitError, match=r"a BERT checkpoint \(--arch bert\), but this run is --"):
        init_model_config(bert, BASE, RUN_FLAGS)


def test_without_arch_the_architecture_comes_from_the_checkpoint(mb_folder):
    """No --arch and no --model (the parser's BERT defaults, attention auto resolved to BERT's
    full): the config is the one `--arch modernbert` gives, document attention included, and
    the flags given are kept."""
    bert_defaults = dataclasses.replace(PRESETS["tiny"], attention="full")
    named = dataclasses.replace(PRESETS["modernbert-tiny"], attention="document")
    for flags in ({}, {"loss_impl": "torch", "hidden_dropout_prob": 0.05}):
        # the command line puts the flags onto its preset before the checkpoint is read
        on_bert = dataclasses.replace(bert_defaults, **flags)
        cfg = init_model_config(mb_folder, on_bert, flags, max_seq_len=64)
        on_named = dataclasses.replace(named, **flags)
        ref = init_model_config(mb_folder, on_named, {**RUN_FLAGS, **flags}, max_seq_len=64)
        assert cfg == ref
        assert (cfg.arch, cfg.attention, cfg.vocab_multiple) == ("modernbert", "document", 64)
    assert cfg.loss_impl == "torch" and cfg.hidden_dropout_prob == 0.05
    full = init_model_config(mb_folder, bert_defaults, {"attention": "full"})
    assert full.attention == "full"  # an explicit --attention stays
