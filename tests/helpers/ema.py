"""The checks of a launch trained with --ema (pretrain.components.ema), shared by the tests that
run one: every checkpoint's EMA against a float64 oracle of the saved weights, exact on resume,
and export --ema."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.pretrain.components.ema import EMA_FILE, load_ema
from bertforge.pretrain.config.flag_checks import EMAError
from bertforge.pretrain.export.hf_export import export
from bertforge.pretrain.run_folder.run_checkpoints import (
    consolidated_state_dict,
    is_complete,
    tag_for,
    verify,
)


def ema_oracle(weights: list[dict[str, torch.Tensor]], decay: float) -> dict[str, torch.Tensor]:
    """float64 EMA of the weights after each applied step (the first one starts it)."""
    out = {k: v.double() for k, v in weights[0].items()}
    for w in weights[1:]:
        out = {k: decay * out[k] + (1.0 - decay) * w[k].double() for k in out}
    return out


def check_ema_of_run(run: Path, resumed: Path, *, steps: int, decay: float, no_ema: Path) -> None:
    """``run`` saved every step 1..steps with --ema ``decay``; ``resumed`` is a --resume auto of
    it from step ``steps - 1``; ``no_ema`` a run without --ema."""
    ckpts = [run / "checkpoints" / tag_for(s) for s in range(1, steps + 1)]
    weights = [consolidated_state_dict(c) for c in ckpts]
    for k, ckpt in enumerate(ckpts, start=1):
        assert EMA_FILE in (ckpt / "COMPLETE").read_text()  # listed in the manifest
        saved, want = load_ema(ckpt), ema_oracle(weights[:k], decay)
        assert set(saved) <= set(want) and len(saved) > 0
        for name, tensor in saved.items():
            assert tensor.dtype == torch.float32
            torch.testing.assert_close(tensor.double(), want[name], rtol=1e-6, atol=1e-7)
    last = tag_for(steps)
    a, b = load_ema(ckpts[-1]), load_ema(resumed / "checkpoints" / last)
    assert all(torch.equal(a[k], b[k]) for k in a)  # a resume's EMA is the uninterrupted run's
    # A torn EMA file makes the checkpoint fail verification.
    torn = ckpts[0] / EMA_FILE
    data = torn.read_bytes()
    torn.write_bytes(data[:-8])
    assert is_complete(ckpts[0]) and verify(ckpts[0])
    torn.write_bytes(data)

    out = export(run, run.parent / "hf_ema", verify=False, ema=True)
    from safetensors.torch import load_file

    exported = load_file(str(Path(out["output"]) / "model.safetensors"))
    for name, tensor in a.items():
        assert torch.equal(exported[name], tensor), name
    with pytest.raises(EMAError, match="holds no ema.safetensors"):
        export(no_ema, no_ema.parent / "hf_plain", verify=False, ema=True)
