"""The HF Trainer side of the learning-per-hour benchmark: its launch command, one rank's body
(under torchrun) and the wall-clock callback that saves its snapshots and stops it at T.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.common import random_bert_mlm
from bertforge.files import write_json_atomic


def without_launcher(args) -> bool:
    """``--quick`` on one rank: each side runs as one plain process, without its launcher."""
    return bool(getattr(args, "quick", False)) and args.ranks == 1


def dropout_fields(args) -> dict:
    """``--dropout P`` as both models' config fields (ours: the trainer's flags of those names;
    HF: its BertConfig's); empty when not given."""
    if args.dropout is None:
        return {}
    return {"hidden_dropout_prob": args.dropout, "attention_probs_dropout_prob": args.dropout}


def hf_command(shards: Path, out: Path, args, launched: float) -> list[str]:
    """``torchrun --nproc_per_node R -m benchmarks.learning.per_hour --hf_worker ...`` (``--quick``
    on one rank: ``python -m benchmarks.learning.per_hour --hf_worker ...``, one plain process)."""
    launcher = [sys.executable]
    if not without_launcher(args):
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks)]
        launcher += ["--master_port", str(args.port + 1)]
    return [
        *launcher,
        *("-m", "benchmarks.learning.per_hour"),
        *("--hf_worker", "--shards", str(shards), "--hf_out", str(out)),
        *("--model", args.model, "--precision", args.precision),
        *("--budget_s", str(args.budget_s), "--snapshots", str(args.snapshots)),
        *("--global_batch", str(args.global_batch), "--lr", str(args.lr)),
        *("--warmup_steps", str(args.warmup_steps), "--launched", repr(launched)),
        *(("--init_model", str(args.init_model)) if args.init_model else ()),
        *(("--dropout", str(args.dropout)) if args.dropout is not None else ()),
    ]


def hf_worker(args) -> None:
    """One HF Trainer rank (under torchrun, or alone): train until the budget, snapshots by the
    callback."""
    import numpy as np
    import transformers
    from transformers import DataCollatorForLanguageModeling, Trainer

    from bertforge.data_prep.reader import ShardReader

    reader = ShardReader(args.shards, "train")
    tok = transformers.AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [
        {"input_ids": np.asarray(reader[i].input_ids, dtype=np.int64).tolist()}
        for i in range(len(reader))
    ]
    model = hf_model(args, len(tok))
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    targs = hf_training_args(args, int(os.environ.get("WORLD_SIZE", "1")))
    clock = snapshot_clock(args)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)
    Trainer(
        model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=[clock]
    ).train()
    if int(os.environ.get("RANK", "0")) == 0:
        write_json_atomic(Path(args.hf_out, "snapshots.json"), clock.records)


def hf_model(args, vocab_size: int):
    """The seeded folder as saved (continued mode: ``--init_model``), else a random model of the
    preset; SDPA attention either way, ``--dropout`` applied."""
    import transformers

    if args.init_model:
        return transformers.BertForMaskedLM.from_pretrained(
            args.init_model, attn_implementation="sdpa", **dropout_fields(args)
        )
    return random_bert_mlm(
        args.model, vocab_size, attn_implementation="sdpa", **dropout_fields(args)
    )


def hf_training_args(args, world: int):
    """TrainingArguments as a careful user sets them on CPU: no logging, saving or evaluation."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(Path(args.hf_out) / "trainer"),
        per_device_train_batch_size=args.global_batch // world,
        gradient_accumulation_steps=1,
        max_steps=10_000_000,  # the wall-clock callback ends the run
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",  # torch's fused AdamW runs on CPU: the fastest choice here
        bf16=args.precision == "bf16",  # autocast to bf16
        use_cpu=True,
        dataloader_num_workers=1,
        dataloader_persistent_workers=True,  # no worker restart at each epoch boundary
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        # gloo under torchrun; alone (no launcher: no LOCAL_RANK) no process group at all
        ddp_backend="gloo" if "LOCAL_RANK" in os.environ else None,
        ddp_find_unused_parameters=False,  # every parameter is used: skip the extra graph walk
        disable_tqdm=True,
        seed=0,
    )


def snapshot_clock(args):
    """A TrainerCallback that saves the model at wall-clock marks k*T/S from launch (save time
    excluded) and stops the run at T of wall time; rank 0 decides, all ranks follow (one
    broadcast per step, as our trainer's one all-reduce per step for its save/stop decision)."""
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class SnapshotClock(TrainerCallback):
        def __init__(self):
            self.launched, self.budget = float(args.launched), float(args.budget_s)
            self.marks = [self.budget * k / args.snapshots for k in range(1, args.snapshots)]
            self.out, self.save_s, self.records = Path(args.hf_out), 0.0, []

        def on_train_begin(self, targs, state, control, model=None, **_kw):
            # continued mode: the model as the Trainer starts it, at time 0 of the curve
            if args.init_model and state.is_world_process_zero:
                self.save(model, 0, 0.0)
                self.records[-1]["time_s"] = 0.0

        def on_step_end(self, targs, state, control, model=None, **_kw):
            wall = time.time() - self.launched
            due = bool(self.marks) and wall - self.save_s >= self.marks[0]
            flags = torch.tensor([float(due), float(wall >= self.budget)])
            if dist.is_initialized():
                dist.broadcast(flags, 0)
            due, stop = bool(flags[0]), bool(flags[1])
            if (due or stop) and state.is_world_process_zero:
                self.save(model, state.global_step, wall)
            if due and self.marks:
                self.marks.pop(0)
            if stop:
                control.should_training_stop = True

        def save(self, model, step: int, wall: float) -> None:
            start = time.time()
            folder = self.out / f"step_{step:06d}"
            model.save_pretrained(str(folder))
            self.records.append(
                {"model": str(folder), "step": step, "wall_s": wall, "time_s": wall - self.save_s}
            )
            self.save_s += time.time() - start

    return SnapshotClock()
