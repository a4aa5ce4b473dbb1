"""Document attention (--attention document): a packed document is encoded as if alone, for both
archs; the loader's document index on real shards; the unpadded one-row form; the flag."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.config.cli import config_from_args, trainer_parser
from bertforge.pretrain.data.loader import BatchPlan, MaskedBatches
from bertforge.pretrain.data.masking import MaskingConfig
from bertforge.pretrain.model.document_attention import (
    AttentionError,
    document_index,
    document_mask,
    unpad,
)
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.registry import build_model, resolve_attention

VOCAB, CLS, SEP, PAD = 100, 2, 3, 0
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 128,  # the shards' max_seq_len
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# Three layers: global, local, local; a window of 4 tokens (|q - k| <= 2) is shorter than every
# document below, so the local layers' window and the document mask must combine.
MODERN = {**TINY, "num_hidden_layers": 3, "intermediate_size": 48, "local_attention": 4}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _model(arch: str, nsp: bool = False, vocab: int = VOCAB):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, **(MODERN if arch == "modernbert" else TINY))
    if arch == "modernbert":
        cfg.layer_norm_eps, cfg.vocab_multiple = 1e-5, 64
    return build_model(cfg, vocab, nsp=nsp).eval()


def _documents() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(5, VOCAB, (n,), generator=g) for n in (6, 5, 7)]


def _packed() -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0: [CLS] d0 [SEP] d1 [SEP] d2 [SEP]; row 1: [CLS] d1 [SEP] and padding."""
    d0, d1, d2 = _documents()
    sep, cls = torch.tensor([SEP]), torch.tensor([CLS])
    row0 = torch.cat([cls, d0, sep, d1, sep, d2, sep])
    row1 = torch.cat([cls, d1, sep])
    ids = torch.full((2, len(row0)), PAD)
    ids[0], ids[1, : len(row1)] = row0, row1
    return ids, torch.tensor([len(row0), len(row1)])


def test_document_index_and_restarted_positions():
    ids, lengths = _packed()
    docs, pos = document_index(ids.numpy(), lengths.numpy(), SEP)
    # [CLS] goes with the first document, each [SEP] closes the document before it.
    want0 = [0] * 8 + [1] * 6 + [2] * 8
    assert docs[0].tolist() == want0
    assert pos[0].tolist() == list(range(8)) + list(range(6)) + list(range(8))
    assert docs[1].tolist() == [0] * 7 + [-1] * 15 and pos[1].tolist() == list(range(7)) + [0] * 15
    nsp_docs, nsp_pos = document_index(ids.numpy(), lengths.numpy(), SEP, nsp=True)
    assert nsp_docs[0].tolist() == [0] * 22 and nsp_pos[0].tolist() == list(range(22))
    assert nsp_docs[1].tolist() == [0] * 7 + [-1] * 15


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_a_packed_document_is_encoded_as_if_alone(arch):
    model = _model(arch)
    ids, lengths = _packed()
    docs, pos = (torch.from_numpy(a) for a in document_index(ids.numpy(), lengths.numpy(), SEP))
    with torch.no_grad():
        packed = model.encode(ids, document_ids=docs, position_ids=pos)
        full = model.encode(ids, attention_mask=(docs >= 0).long())
        d0, d1, d2 = _documents()
        sep, cls = torch.tensor([SEP]), torch.tensor([CLS])
        alone = [torch.cat([cls, d0, sep]), torch.cat([d1, sep]), torch.cat([d2, sep])]
        worst = 0.0
        for k, tokens in enumerate(alone):
            ref = model.encode(tokens[None])[0]
            worst = max(worst, rel(packed[0][docs[0] == k], ref))
        worst = max(worst, rel(packed[1, :7], model.encode(torch.cat([cls, d1, sep])[None])[0]))
    print(f"{arch}: max rel diff packed vs alone {worst:.2e}")
    assert worst < 1e-5
    assert rel(full[0, 8:14], packed[0, 8:14]) > 1e-3  # full attention does see across


def test_the_window_stays_inside_the_document():
    m = document_mask(torch.tensor([[0, 0, 0, 0, 0, 1, 1, -1]]), window=2)[0, 0]
    assert m[0].tolist() == [True, True, True, False, False, False, False, False]
    assert m[4].tolist() == [False, False, True, True, True, False, False, False]
    assert m[5].tolist() == [False] * 5 + [True, True, False]
    assert m[7].tolist() == [False] * 7 + [True]  # padding sees only padding: no empty row


def _reader_batch(shards, attention: str, n: int = 8) -> dict:
    """n - 1 sequences of the training split and its shortest one, so that the batch is padded,
    as one masked batch."""
    reader = ShardReader(shards)
    lengths = reader.get_batch(np.arange(len(reader)), word_start=False).lengths
    idx = np.append(np.arange(n - 1), np.argmin(lengths))
    plan = BatchPlan(idx, np.zeros_like(idx), idx)
    return MaskedBatches(reader, MaskingConfig(), attention=attention).__getitems__(plan)


def test_the_loaders_document_index_matches_the_separators(english_shards, english_nsp_shards):
    reader = ShardReader(english_shards)
    sep = reader.special_tokens["sep"]
    plan_ids = np.arange(min(len(reader), 64))
    ds = MaskedBatches(reader, MaskingConfig(), attention="document")
    batch = ds.__getitems__(BatchPlan(plan_ids, np.zeros_like(plan_ids), plan_ids))
    raw = reader.get_batch(plan_ids, pad_to_multiple_of=8)
    docs, pos = batch["document_ids"].numpy(), batch["position_ids"].numpy()
    several = 0
    for r in range(len(plan_ids)):
        seq = raw.input_ids[r, : raw.lengths[r]]
        want = np.concatenate([[0], np.cumsum(seq == sep)[:-1]])
        assert docs[r, : len(seq)].tolist() == want.tolist()
        assert (docs[r, len(seq) :] == -1).all()
        starts = np.flatnonzero(np.diff(want, prepend=-1))
        for s, e in zip(starts, [*starts[1:], len(seq)]):
            assert pos[r, s:e].tolist() == list(range(e - s))
        several += int(want[-1] > 0)
    assert several, "no sequence of the sample packs two documents"
    assert batch["labels"].shape == docs.shape  # masking as in full mode
    nsp = _reader_batch(english_nsp_shards, "document")
    real = nsp["attention_mask"].bool()
    assert (nsp["document_ids"][real] == 0).all() and (nsp["document_ids"][~real] == -1).all()


def test_an_unpadded_batch_gives_the_padded_loss(english_shards, english_nsp_shards):
    worst = {}
    nsp = _reader_batch(english_nsp_shards, "full")
    nsp.pop("masking_stats")
    vocab = ShardReader(english_nsp_shards).vocab_size
    bert = _model("bert", nsp=True, vocab=vocab)
    packed = _reader_batch(english_shards, "document")
    packed.pop("masking_stats")
    modern = _model("modernbert", vocab=vocab)
    with torch.no_grad():
        for name, model, batch in (("bert nsp", bert, nsp), ("modernbert", modern, packed)):
            assert not batch["attention_mask"].all()  # padded
            one_row = unpad(batch)
            assert one_row["input_ids"].shape == (1, int(batch["attention_mask"].sum()))
            a, b = model(**batch), model(**one_row)
            worst[name] = rel(b["loss"], a["loss"])
            assert int(a["num_masked"]) == int(b["num_masked"]) > 0
            assert int(a["num_correct"]) == int(b["num_correct"])
        print("max rel diff padded vs unpadded loss:", worst)
        assert float(bert(**nsp)["nsp_loss"]) > 0
    assert max(worst.values()) < 1e-5


def _cfg(*flags: str):
    parser, names = trainer_parser()
    return config_from_args(parser.parse_args(["--data", "X", *flags]), names, parser)


def test_the_flag_resolves_per_arch_and_refuses_unknown_values(capsys):
    assert resolve_attention("auto", "bert") == "full"
    assert resolve_attention("auto", "modernbert") == "document"
    assert resolve_attention("document", "bert") == "document"
    with pytest.raises(AttentionError, match="--attention"):
        resolve_attention("local", "bert")
    assert _cfg().model_cfg.attention == "full"
    assert _cfg("--arch", "modernbert").model_cfg.attention == "document"
    assert _cfg("--arch", "modernbert", "--attention", "full").model_cfg.attention == "full"
    assert _cfg("--attention", "document").model_cfg.attention == "document"
    with pytest.raises(SystemExit) as e:
        _cfg("--attention", "docs")
    assert e.value.code == 2 and "--attention 'docs'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="resolve auto"):
        MaskedBatches(ShardReader.__new__(ShardReader), MaskingConfig(), attention="auto")


def test_the_dry_run_prints_the_attention(english_shards):
    import io

    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.dry_run import run_dry_run

    out = io.StringIO()
    cfg = ModelConfig(attention="document", **TINY)
    run_dry_run(
        str(english_shards),
        cfg,
        MaskingConfig(),
        DataConfig(),
        1,
        micro_batch_size=2,
        stream=out,
        show_masks=1,
    )
    assert "attention document: a token sees its own document" in out.getvalue()


def test_a_resume_under_the_other_mode_is_refused(tmp_path):
    from bertforge.pretrain.checkpoints.resume import check_compatible
    from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

    state = {"tokenizer_fingerprint": "f", "vocab_size": 10, "config": {"model_cfg": {}}}
    state["config"]["model_cfg"]["attention"] = "full"
    kw = {"vocab_size": 10, "tokenizer_fingerprint": "f", "path": tmp_path}
    check_compatible(state, model_config={"attention": "full"}, **kw)
    with pytest.raises(CheckpointError, match="model.attention = 'full'"):
        check_compatible(state, model_config={"attention": "document"}, **kw)


def test_a_checkpoint_from_before_the_flag_counts_as_full_attention(tmp_path):
    """A run saved before --attention existed had every token see the whole sequence: its
    resume under document attention (modernbert's auto) is refused, under full it goes on."""
    from bertforge.pretrain.checkpoints.resume import check_compatible
    from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

    state = {
        "tokenizer_fingerprint": "f",
        "vocab_size": 10,
        "config": {"model_cfg": {"arch": "modernbert"}},
    }
    kw = {"vocab_size": 10, "tokenizer_fingerprint": "f", "path": tmp_path}
    check_compatible(state, model_config={"arch": "modernbert", "attention": "full"}, **kw)
    with pytest.raises(CheckpointError, match="model.attention = 'full'"):
        check_compatible(state, model_config={"arch": "modernbert", "attention": "document"}, **kw)
