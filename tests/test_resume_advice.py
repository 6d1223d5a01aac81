"""A refused resume must not advise a change that the next check refuses too.

The "nothing left to train" refusal advises ``--start_over true``, not
"raise max_steps (with --resume_with_changes true)": max_steps is fixed on
resume, so that advice would meet a second refusal. Checked against real
checkpoint folders.
"""

from __future__ import annotations

import json

import pytest

from real_fae_core.errors import UserError

resume_checks = pytest.importorskip("real.training.checkpoints")
fingerprint = pytest.importorskip("real.training.fingerprint")


def _checkpoint(tmp_path, step: int, settings: dict):
    ckpt = tmp_path / f"checkpoint-{step}"
    ckpt.mkdir()
    state = {"global_step": step, "stateful_callbacks": {
        fingerprint.CALLBACK_NAME: {"args": {"settings": settings}, "attributes": {}}}}
    (ckpt / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    return str(ckpt)


def test_finished_checkpoint_advice_can_be_followed(tmp_path):
    settings = {"max_steps": 8, "learning_rate": 1e-4, "seed": 42}
    ckpt = _checkpoint(tmp_path, 8, settings)
    with pytest.raises(UserError) as first:
        resume_checks.check_resume(ckpt, settings, max_steps=8, allow_changes=False)
    advice = str(first.value)
    assert "--start_over true" in advice and "a resume cannot change max_steps" in advice
    assert "raise max_steps" not in advice
    # the advice it does not give (raise max_steps, pass --resume_with_changes) is refused by the next check
    raised = {**settings, "max_steps": 12}
    with pytest.raises(UserError, match="max_steps"):
        resume_checks.check_resume(ckpt, raised, max_steps=12, allow_changes=True)
