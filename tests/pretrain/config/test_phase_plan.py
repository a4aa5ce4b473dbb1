"""The phase plan (pretrain.config.phase_plan): parsing, errors naming where, resolving to steps
against a hand-computed case, Megatron's ramp, the lr at the boundaries, world-size independence.
"""

from __future__ import annotations

import json

import pytest

from bertforge.pretrain.config.phase_plan import (
    PhasePlanError,
    load_phase_file,
    main,
    plan_dict,
    plan_schedule,
    plan_table,
    resolve,
)
from bertforge.pretrain.config.schedule import ramp_batch

SEQ = 128
THREE = {
    "phases": [
        {
            "name": "warmup",
            "steps": 4,
            "lr": "warmup",
            "batch": {"start": 8, "increment": 8, "ramp_tokens": 16 * SEQ},
        },
        {"name": "stable", "steps": 3, "lr": "constant", "batch": 16},
        {
            "name": "decay",
            "tokens": 32 * SEQ,
            "lr": "linear",
            "min_lr_ratio": 0.1,
            "data": ["general=0.3", "domain=0.7"],
            "mask_prob": 0.2,
        },
    ]
}


def write(tmp_path, doc, name="plan.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def resolved(tmp_path, doc=THREE, world=2, micro=4, glob=16, arch="bert"):
    path = write(tmp_path, doc)
    return resolve(
        load_phase_file(path),
        path=str(path),
        global_batch=glob,
        micro_batch=micro,
        world_size=world,
        seq_len=lambda data: SEQ,
        arch=arch,
    )


def test_three_phases_resolve_to_hand_computed_boundaries(tmp_path):
    plan = resolved(tmp_path)
    # warmup: consumed 0, 8 -> batch 8 (one increment every 16 samples), then 16 -> 16, 32 > 16
    got = [(p.name, p.start_step, p.end_step, p.start_consumed, p.end_consumed) for p in plan]
    assert got == [("warmup", 0, 4, 0, 48), ("stable", 4, 7, 48, 96), ("decay", 7, 9, 96, 128)]
    schedule = plan_schedule(plan, 16)  # the run's schedule answers each step's batch
    assert [schedule.batch_at(s, c) for s, c in [(0, 0), (1, 8), (2, 16), (3, 32)]] == [
        8,
        8,
        16,
        16,
    ]
    assert (plan[0].batch_start, plan[0].batch_end) == (8, 16)
    assert plan[2].tokens == 32 * SEQ and plan[2].own_data and plan[2].mask_prob == 0.2
    assert plan[1].data is None and plan[1].mask_prob is None


def test_lr_multiplier_at_each_boundary(tmp_path):
    plan = resolved(tmp_path)
    lrs = [plan_schedule(plan)(s) for s in range(9)]
    # warmup reaches the peak at its last step; the decay goes 1.0 -> floor 0.1 over 2 steps
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 0.55, 0.1])
    assert [(p.lr_start, p.lr_end) for p in plan] == pytest.approx(
        [(0.25, 1.0), (1.0, 1.0), (0.55, 0.1)]
    )


def test_resolving_does_not_depend_on_world_size(tmp_path):
    one = plan_dict(resolved(tmp_path, world=1, micro=8))
    two = plan_dict(resolved(tmp_path, world=2, micro=4))
    assert one == two


def test_megatron_ramp_semantics():
    ramp = {"start": 4, "increment": 4, "ramp_samples": 90}  # 3 increments, one per 30 samples
    assert [ramp_batch(ramp, 16, c) for c in (0, 29, 30, 59, 60, 89, 90, 91)] == [
        4,
        4,
        8,
        8,
        12,
        12,
        16,
        16,
    ]


@pytest.mark.parametrize(
    ("phase", "key"),
    [
        ({"steps": 2, "bogus": 1}, "bogus"),
        ({"steps": 2, "tokens": 5}, "steps"),
        ({"lr": "constant"}, "steps"),
        ({"steps": "2"}, "steps"),
        ({"steps": 2, "lr": "warm"}, "lr"),
        ({"steps": 2, "lr": "cosine"}, "lr"),  # a decay first: nothing to decay from
        ({"steps": 2, "batch": {"start": 8, "step": 8}}, "batch"),
        ({"steps": 2, "mask_prob": 1.5}, "mask_prob"),
        ({"steps": 2, "data": 3}, "data"),
    ],
)
def test_bad_phase_names_phase_and_key(tmp_path, phase, key):
    path = write(tmp_path, {"phases": [{"name": "first", **phase}]})
    with pytest.raises(PhasePlanError) as err:
        load_phase_file(path)
    msg = str(err.value)
    assert str(path) in msg and "phase 1 ('first')" in msg and repr(key) in msg


def test_bad_json_names_the_line(tmp_path):
    path = write(tmp_path, '{"phases": [\n  {"steps": 2,}\n]}')
    with pytest.raises(PhasePlanError, match=r"line 2, column"):
        load_phase_file(path)


def test_a_yaml_plan_equals_its_json_and_bad_yaml_names_the_line(tmp_path):
    import yaml

    as_yaml = write(tmp_path, yaml.safe_dump(THREE, sort_keys=False), name="plan.yaml")
    assert load_phase_file(as_yaml) == load_phase_file(write(tmp_path, THREE))
    bad = write(tmp_path, "phases:\n  - steps: 2\n    lr: [warmup\n", name="bad.yml")
    with pytest.raises(PhasePlanError, match=r"bad.yml: line \d+, column \d+: not valid YAML"):
        load_phase_file(bad)
    with pytest.raises(PhasePlanError, match=r"phase 1 \('phase1'\), key 'lr'"):
        load_phase_file(write(tmp_path, "phases:\n  - {steps: 2, lr: flat}\n", name="k.yaml"))


def test_duplicate_names_refused(tmp_path):
    doc = {"phases": [{"name": "a", "steps": 1}, {"name": "a", "steps": 1}]}
    with pytest.raises(PhasePlanError, match=r"phase 2 \('a'\), key 'name'"):
        load_phase_file(write(tmp_path, doc))


def test_ramp_not_divisible_by_micro_times_world_names_the_key(tmp_path):
    # a ramp's start below one micro batch per rank is "smaller than", not "not divisible"
    with pytest.raises(
        PhasePlanError, match=r"key 'batch.start'.*smaller than micro batch x world size = 16"
    ):
        resolved(tmp_path, world=4, micro=4, glob=32)


def test_rope_theta_only_with_modernbert(tmp_path):
    doc = {"phases": [{"steps": 2}, {"steps": 2, "rope_theta": 160000}]}
    with pytest.raises(PhasePlanError, match=r"phase 2 \('phase2'\), key 'rope_theta'"):
        resolved(tmp_path, doc)
    plan = resolved(tmp_path, doc, arch="modernbert")
    assert [p.rope_theta for p in plan] == [None, 160000.0]


def test_checker_command_prints_the_table(tmp_path, capsys):
    path = write(tmp_path, THREE)
    argv = [str(path), "--global_batch_size", "16", "--micro_batch_size", "4"]
    assert main([*argv, "--world_size", "2", "--seq_len", str(SEQ)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == plan_table(resolved(tmp_path))
    assert "[7, 9)" in out and "8 -> 16" in out and "general=0.3 domain=0.7" in out
    assert main([*argv, "--world_size", "4", "--seq_len", str(SEQ)]) == 2
    assert "batch.start" in capsys.readouterr().err


def test_ramp_in_a_steps_phase_needs_ramp_tokens(tmp_path):
    doc = {"phases": [{"steps": 4, "lr": "warmup", "batch": {"start": 8, "increment": 8}}]}
    with pytest.raises(PhasePlanError, match=r"key 'batch.ramp_tokens'"):
        resolved(tmp_path, doc)
    doc["phases"][0] = {"tokens": 16 * SEQ, "batch": {"start": 8, "increment": 8}}
    plan = resolved(tmp_path, doc)  # the ramp over the whole phase: 16 samples
    assert plan[0].ramp["ramp_samples"] == 16 and plan[0].end_step == 2


def test_phase_schedule_matches_the_plan_and_is_restored_by_schedulelr(tmp_path):
    import torch

    from bertforge.pretrain.config.schedule import Schedule
    from bertforge.pretrain.schedule.optim import ScheduleLR

    plan = resolved(tmp_path)
    schedule = plan_schedule(plan, 16)
    assert [name for name, _, _ in schedule.phases()] == [ph.name for ph in plan]
    assert [schedule(s) for s in range(9)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 0.55, 0.1]
    )

    def scheduler(fn):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, ScheduleLR(opt, fn)

    opt, sched = scheduler(schedule)
    for _ in range(7):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2, sched2 = scheduler(lambda step: 1.0)  # the flags' schedule of a later launch
    sched2.load_state_dict(state)
    assert isinstance(sched2.lr_lambdas[0], Schedule) and sched2.lr_lambdas[0].kind == "phases"
    assert sched2.last_epoch == 7 and sched2.lr_lambdas[0](7) == pytest.approx(0.55)
    opt2.step()
    sched2.step()  # step 8's lr, the decay's floor, from the restored plan
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1)


def test_the_run_refuses_contradicting_flags_and_unopenable_data(tmp_path):
    from types import SimpleNamespace

    from bertforge.pretrain.config.batching import BatchPlan
    from bertforge.pretrain.config.train_config import OptimConfig, RunConfig, TrainConfig
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.schedule.phases import PhaseTracker

    def tracker(doc, **optim):
        run = {"phases": str(write(tmp_path, doc))}
        run.update({k: v for k, v in optim.items() if not hasattr(OptimConfig, k)})
        cfg = TrainConfig(
            run=RunConfig(**run),
            optim=OptimConfig(**{k: v for k, v in optim.items() if hasattr(OptimConfig, k)}),
            data_cfg=DataConfig(),
        )
        setup = SimpleNamespace(batch=BatchPlan(16, 4, 2, 2))
        return cfg, PhaseTracker.for_run(cfg, setup, SEQ, "bert")

    doc = {"phases": THREE["phases"][:2]}
    cfg, t = tracker(doc)
    # the plan's length replaces the default at resolution (pretrain.build.resolve_run), in a new
    # config: the parsed one is not edited
    assert t.plan[-1].end_step == 7 and cfg.run.max_steps == 100
    assert [t.batch_plan(s, c).grad_accum for s, c in [(0, 0), (2, 16), (5, 80)]] == [1, 2, 2]
    with pytest.raises(PhasePlanError, match="--schedule, --warmup_steps"):
        tracker(doc, schedule="wsd", warmup_steps=3)
    with pytest.raises(PhasePlanError, match="--max_steps 50 disagrees"):
        tracker(doc, max_steps=50)
    # THREE's decay data is not a shard folder here: refused naming the phase and key
    with pytest.raises(PhasePlanError, match=r"phase 3 \('decay'\), key 'data'.*general=0.3"):
        tracker(THREE)
    _, t = tracker({"phases": [*doc["phases"], {"steps": 2, "mask_prob": 0.3}]})
    base = MaskingConfig()
    masking_at = t.schedule.masking_at  # the schedule answers each step's masking
    assert masking_at(8, base).mask_prob == 0.3 and masking_at(6, base) is base
    assert [s for s in range(9) if t.schedule.loader_changes_at(s, base)] == [7]


def test_resume_under_a_changed_plan_is_refused_naming_the_change(tmp_path):
    from types import SimpleNamespace

    from bertforge.pretrain.config.batching import BatchPlan
    from bertforge.pretrain.config.train_config import RunConfig, TrainConfig
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.schedule.phases import PhaseTracker

    def tracker(doc):
        cfg = TrainConfig(run=RunConfig(phases=str(write(tmp_path, doc))), data_cfg=DataConfig())
        return PhaseTracker.for_run(cfg, SimpleNamespace(batch=BatchPlan(16, 4, 2, 2)), SEQ, "bert")

    doc = {"phases": THREE["phases"][:2]}
    point = SimpleNamespace(state={"phases": tracker(doc).as_dict(), "step": 2})
    tracker(doc).check_resume(point, override=False)  # the same plan: fine
    doc["phases"][1] = {**doc["phases"][1], "steps": 5}
    with pytest.raises(PhasePlanError, match=r"stable: end_step 7 -> 9"):
        tracker(doc).check_resume(point, override=False)
    tracker(doc).check_resume(point, override=True)  # warned, the new plan applies
