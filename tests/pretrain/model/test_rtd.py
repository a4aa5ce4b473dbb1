"""Replaced-token detection (ELECTRA, --objective rtd) in one process: the pair against
transformers' own Electra classes, the sampling, the corruption, the gradients each embedding
sharing lets through, and what the objective refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.model.errors import ArchError, ObjectiveError
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.registry import PRESETS, build_model, check_supported
from bertforge.pretrain.model.rtd import (
    corrupt,
    discriminator_loss,
    generator_config,
    sample_replacements,
)
from bertforge.pretrain.model.specs import objective_of_run, resolve_objective

VOCAB = 203  # not a multiple of 8: the padding rows must stay out of every softmax


def rtd_model(sharing: str = "plain", seed: int = 0, preset: str = "tiny", **settings):
    torch.manual_seed(seed)
    cfg = ObjectiveConfig(objective="rtd", embedding_sharing=sharing, **settings)
    model = build_model(PRESETS[preset], VOCAB, objective=resolve_objective(cfg, "packed"))
    return model.eval()


def masked_batch(seed: int = 1):
    """ids [2, 24] with 6 masked positions each, the second sequence padded after 20."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (2, 24), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 2:8] = ids[:, 2:8]
    inputs = ids.clone()
    inputs[:, 2:8] = 4  # [MASK]
    attention = torch.ones_like(ids)
    attention[1, 20:] = 0
    return inputs, attention, labels


def test_generator_size_follows_the_encoders_head_size():
    base = PRESETS["base"]  # 768 wide, 12 heads of 64, 12 layers
    gen = generator_config(base, ObjectiveConfig(generator_width=1 / 3, generator_depth=0.5))
    assert (gen.hidden_size, gen.num_attention_heads, gen.num_hidden_layers) == (256, 4, 6)
    assert gen.intermediate_size == 1024
    tiny = generator_config(PRESETS["tiny"], ObjectiveConfig())  # 2 heads: at least one
    assert (tiny.hidden_size, tiny.num_attention_heads) == (64, 1)


def test_a_sample_equal_to_the_original_counts_as_original():
    inputs, _, labels = masked_batch()
    sampled = labels[labels != IGNORE_INDEX].clone()
    sampled[::2] = (sampled[::2] + 1) % VOCAB  # every other sample differs from the original
    corrupted, replaced = corrupt(inputs, labels, sampled)
    masked = labels != IGNORE_INDEX
    assert torch.equal(corrupted[~masked], inputs[~masked])  # only masked positions change
    assert torch.equal(corrupted[masked], sampled)
    assert torch.equal(replaced[masked], sampled != labels[masked])
    assert not replaced[~masked].any() and int(replaced.sum()) == 6


def test_sampling_draws_from_the_softmax():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(40000, 1)
    counts = torch.bincount(sample_replacements(logits), minlength=4).double() / 40000
    torch.testing.assert_close(counts, torch.softmax(logits[0].double(), 0), atol=0.01, rtol=0)


@pytest.mark.parametrize("sharing", ["plain", "disentangled"])
def test_the_discriminator_is_transformers_electra_for_pretraining(sharing):
    """Our discriminator's logits and loss against ElectraForPreTraining holding the exported
    weights (the disentangled table written as shared + difference)."""
    model = rtd_model(sharing)
    with torch.no_grad():  # a difference that is not zero: the export must add it
        if sharing == "disentangled":
            model.discriminator.electra.embeddings.word_embeddings.delta.normal_(0, 0.02)
    hf = transformers.ElectraForPreTraining(model.hf_config(unpad_vocab=True)).eval()
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(unpad_vocab=True), strict=False)
    assert not missing and not unexpected
    inputs, attention, labels = masked_batch()
    replaced = labels != IGNORE_INDEX
    replaced[0, 3] = False
    ours = model.discriminator_logits(inputs, attention)
    with torch.no_grad():
        out = hf(input_ids=inputs, attention_mask=attention, labels=replaced.long())
    real = attention.bool()
    torch.testing.assert_close(ours[real], out.logits[real], atol=1e-5, rtol=1e-5)
    assert not ours[~real].any()
    loss = discriminator_loss(ours[real], replaced[real])  # BCE over the real tokens
    torch.testing.assert_close(loss["rtd_loss"], out.loss, atol=1e-6, rtol=1e-6)
    assert int(loss["rtd_tokens"]) == 44 and int(loss["rtd_replaced"]) == 11


def test_the_generator_is_transformers_electra_for_masked_lm():
    """The generator's masked-row logits and the fused MLM loss against ElectraForMaskedLM."""
    model = rtd_model()
    conf, sd = model.generator_hf()
    hf = transformers.ElectraForMaskedLM(conf).eval()
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not missing and not unexpected
    inputs, attention, labels = masked_batch()
    with torch.no_grad():
        ref = hf(input_ids=inputs, attention_mask=attention).logits[labels != IGNORE_INDEX]
        out = model(input_ids=inputs, attention_mask=attention, labels=labels)
    ours = model.predict_masked(inputs, attention, None, labels)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    expected = F.cross_entropy(ref.double(), labels[labels != IGNORE_INDEX])
    torch.testing.assert_close(out["mlm_loss"].double(), expected, atol=1e-5, rtol=1e-5)
    total = out["mlm_loss"] + 50.0 * out["rtd_loss"]
    torch.testing.assert_close(out["loss"], total)


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
@pytest.mark.parametrize("sharing", ["plain", "disentangled"])
def test_no_gradient_reaches_the_generator_through_the_sample(sharing, preset):
    """The discriminator's loss alone: the generator's layers get no gradient (the sample is not
    differentiated); the shared token table gets one only under plain sharing (DeBERTa-v3's
    disentangled sharing stops it, the difference takes it)."""
    model = rtd_model(sharing, preset=preset).train()
    inputs, attention, labels = masked_batch()
    out = model(input_ids=inputs, attention_mask=attention, labels=labels)
    out["rtd_loss"].backward()
    gen = model.generator
    layers = gen.electra.encoder if preset == "tiny" else gen.model.layers
    assert all(p.grad is None or not p.grad.any() for p in layers.parameters())
    table = gen.get_output_embeddings().weight.grad  # the shared table (the tied decoder)
    if sharing == "plain":
        assert table is not None and table.abs().sum() > 0
    else:
        assert table is None or not table.any()
        delta = [p for n, p in model.discriminator.named_parameters() if n.endswith(".delta")]
        assert delta[0].grad.abs().sum() > 0


@pytest.mark.parametrize("sharing", ["plain", "disentangled"])
def test_the_modernbert_discriminator_is_a_token_classifier_transformers_loads(sharing):
    """--arch modernbert: the discriminator exports as ModernBertForTokenClassification with
    one label whose logit is ours; the generator's MLM loss is the cross-entropy of its logits."""
    model = rtd_model(sharing, preset="modernbert-tiny")
    with torch.no_grad():
        for name, p in model.discriminator.named_parameters():
            if name.endswith(".delta"):
                p.normal_(0, 0.02)
    hf = transformers.ModernBertForTokenClassification(model.hf_config(unpad_vocab=True))
    missing, unexpected = hf.eval().load_state_dict(model.hf_state_dict(unpad_vocab=True), False)
    assert not missing and not unexpected and hf.config.num_labels == 1
    inputs, attention, labels = masked_batch()
    real = attention.bool()
    with torch.no_grad():
        ref = hf(input_ids=inputs, attention_mask=attention).logits[..., 0]
        out = model(input_ids=inputs, attention_mask=attention, labels=labels)
    ours = model.discriminator_logits(inputs, attention)
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=1e-5)
    logits = model.predict_masked(inputs, attention, None, labels).double()
    expected = F.cross_entropy(logits, labels[labels != IGNORE_INDEX])
    torch.testing.assert_close(out["mlm_loss"].double(), expected, atol=1e-5, rtol=1e-5)


def test_the_objective_is_refused_where_it_cannot_train():
    rtd = ObjectiveConfig(objective="rtd")
    with pytest.raises(ObjectiveError, match="--objective rtd trains on packed shards"):
        resolve_objective(rtd, "nsp")
    for preset in ("tiny", "modernbert-tiny"):
        shared = dataclasses.replace(PRESETS[preset], share_layers="all")
        with pytest.raises(ArchError, match="--share_layers all with --objective rtd"):
            check_supported(shared, resolve_objective(rtd, "packed"))
    mlm_nsp = ObjectiveConfig(objective="mlm+nsp")
    with pytest.raises(ArchError, match="--objective mlm\\+nsp: ModernBERT trains mlm, rtd"):
        check_supported(PRESETS["modernbert-tiny"], resolve_objective(mlm_nsp, "nsp"))
    with pytest.raises(ValueError, match="--generator_width 0"):
        ObjectiveConfig(generator_width=0)
    assert resolve_objective(None, "nsp").name == "mlm+nsp"
    # a run recorded before --objective existed: the shards decided
    assert objective_of_run({"model_cfg": {}}, nsp=False).name == "mlm"
    assert objective_of_run({"objective_cfg": dataclasses.asdict(rtd)}, nsp=False).name == "rtd"


def test_the_doctor_counts_both_networks(tmp_path):
    """The memory estimate's parameters are the pair's (each shared tensor once), and the
    generator adds its layers' activations to the discriminator's."""
    from bertforge.pretrain.doctor.memory_estimate import estimate_memory, model_shape

    rtd = ObjectiveConfig(objective="rtd")
    mlm_shape = model_shape(PRESETS["small"], tmp_path, 128, False)  # no shards: 30522 vocab
    rtd_shape = model_shape(PRESETS["small"], tmp_path, 128, False, rtd)
    with torch.device("meta"):
        pair = build_model(PRESETS["small"], 30522, objective=resolve_objective(rtd, "packed"))
    assert rtd_shape.params == sum(p.numel() for p in pair.parameters()) > mlm_shape.params
    gen = rtd_shape.generator
    assert (gen.hidden, gen.layers, gen.heads) == (128, 4, 2)  # small: 512 wide, 8 heads of 64
    ds = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    mlm_mem, rtd_mem = (estimate_memory(s, ds, 8, 32) for s in (mlm_shape, rtd_shape))
    assert rtd_mem.activations > mlm_mem.activations and rtd_mem.params > mlm_mem.params


def _electra_pair(folder, seed: int = 0):
    """An ELECTRA discriminator (hidden 32) and its generator (hidden 16, embeddings 32) as
    transformers writes them, with a WordPiece tokenizer; the generator in folder/generator."""
    from helpers.tiny_bert import tiny_tokenizer

    tok = tiny_tokenizer(folder)
    sizes = {"vocab_size": len(tok), "embedding_size": 32, "max_position_embeddings": 256}
    torch.manual_seed(seed)
    disc = transformers.ElectraConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **sizes
    )
    disc = transformers.ElectraForPreTraining(disc)
    disc.save_pretrained(str(folder))
    gen = transformers.ElectraForMaskedLM(
        transformers.ElectraConfig(
            hidden_size=16, num_hidden_layers=2, num_attention_heads=1, intermediate_size=32,
            **sizes,
        )
    )  # fmt: skip
    # a pair trained together shares its embeddings (ELECTRA ties them)
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.tie_weights()
    gen.save_pretrained(str(folder / "generator"))
    tok.save_pretrained(str(folder / "generator"))
    return tok


def test_init_from_an_electra_pair_as_transformers_writes_it(tmp_path):
    """--init_from an ELECTRA discriminator folder (its generator in generator/): our pair holds
    both networks' weights, its logits are transformers' to 1e-6; an MLM run takes the same
    folder's encoder as its BERT encoder."""
    from bertforge.pretrain.model.init_from import load_initial_weights
    from bertforge.pretrain.model.init_source import init_model_config

    folder = tmp_path / "electra"
    tok = _electra_pair(folder)
    cfg = init_model_config(folder, PRESETS["tiny"], {})
    assert (cfg.arch, cfg.hidden_size, cfg.num_hidden_layers) == ("bert", 32, 2)
    settings = ObjectiveConfig(objective="rtd", generator_width=0.5)
    ours = build_model(cfg, len(tok), objective=resolve_objective(settings, "packed")).eval()
    report = load_initial_weights(ours, folder, tokenizer_dir_of_shards=folder)
    assert not report.newly_initialised and "generator from" in report.notes[0]
    disc = transformers.ElectraForPreTraining.from_pretrained(str(folder)).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(str(folder / "generator")).eval()
    enc = tok(["A class definition is an executable statement.", "Return a list."],
              return_tensors="pt", padding=True)  # fmt: skip
    ids, mask = enc["input_ids"], enc["attention_mask"]
    labels = torch.where(mask.bool(), ids, IGNORE_INDEX)
    with torch.no_grad():
        real = mask.bool()
        want = disc(input_ids=ids, attention_mask=mask).logits
        got = ours.discriminator_logits(ids, mask)
        torch.testing.assert_close(got[real], want[real], atol=1e-6, rtol=1e-6)
        want = gen(input_ids=ids, attention_mask=mask).logits[labels != IGNORE_INDEX]
        torch.testing.assert_close(ours.predict_masked(ids, mask, None, labels), want)
        mlm = build_model(cfg, len(tok)).eval()  # --objective mlm from the same folder
        load_initial_weights(mlm, folder, tokenizer_dir_of_shards=folder)
        want = disc.electra(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(mlm.encode(ids, mask), want, atol=1e-6, rtol=1e-6)


def test_init_from_refuses_electra_small_factorised_embeddings(tmp_path):
    from helpers.tiny_bert import tiny_tokenizer

    from bertforge.pretrain.model.init_source import init_model_config

    folder = tmp_path / "small"
    tok = tiny_tokenizer(folder)
    conf = transformers.ElectraConfig(
        vocab_size=len(tok), embedding_size=16, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64,
    )  # fmt: skip
    transformers.ElectraForPreTraining(conf).save_pretrained(str(folder))
    with pytest.raises(Exception, match="embedding_size 16 != hidden_size 32"):
        init_model_config(folder, PRESETS["tiny"], {})


def test_a_checkpoint_resumes_only_under_its_objective():
    from bertforge.pretrain.model.specs import check_resume_objective

    rtd = ObjectiveConfig(objective="rtd")
    saved = {"objective_cfg": dataclasses.asdict(rtd)}
    check_resume_objective(saved, resolve_objective(rtd, "packed"))  # the same: fine
    check_resume_objective({}, resolve_objective(None, "packed"))  # older runs: mlm
    with pytest.raises(ObjectiveError, match="--objective rtd \\(now mlm\\)"):
        check_resume_objective(saved, resolve_objective(ObjectiveConfig("mlm"), "packed"))
    wider = ObjectiveConfig(objective="rtd", generator_width=0.5)
    with pytest.raises(ObjectiveError, match="--generator_width 0.25 \\(now 0.5\\)"):
        check_resume_objective(saved, resolve_objective(wider, "packed"))
