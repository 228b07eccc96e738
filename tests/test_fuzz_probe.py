"""Success paths next to issue 26's bad-input cases (tests/fuzz_cases_export.py): what the new
checks must still let through, and the bounded drawing of a step of very many micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dnnscale
from dnnscale.cli import app
from dnnscale.report.timeline import MAX_DRAWN_PASSES, step_timeline
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from tests.fuzz_cases_export import PLAN, PREDICTED_PLAN, RESULTS

SMALL_GPT = "gpt:layers=8,hidden=64,heads=4,seq=16,vocab=100"


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2)])
def test_a_step_of_many_micro_batches_draws_its_first_ones(schedule: str, v: int) -> None:
    """40,000 micro-batches over 4 stages: at most MAX_DRAWN_PASSES passes drawn, a note says
    how many of how many, and the model's step is unchanged."""
    w, c = load_workload(SMALL_GPT), load_system("dgx-a100-80g:1")
    p = dnnscale.predict(w, c, dict(tp=1, pp=4, dp=2, micro_batch=1, global_batch=80_000,
                                    schedule=schedule, virtual_stages=v))
    timeline = step_timeline(p, w, c)
    passes = [s for s in timeline.segments if s.name in ("forward", "backward")]
    assert 0 < len(passes) <= MAX_DRAWN_PASSES
    assert any("of the step's 40,000 micro-batches" in note for note in timeline.notes)
    assert timeline.step_s == p.step_time_s


def test_small_steps_are_drawn_whole() -> None:
    w, c = load_workload(SMALL_GPT), load_system("dgx-a100-80g:1")
    p = dnnscale.predict(w, c, dict(tp=1, pp=4, dp=1, micro_batch=1, global_batch=16))
    timeline = step_timeline(p, w, c)
    assert len([s for s in timeline.segments if s.name == "forward"]) == 4 * 16
    assert not any("Drawn: the first" in note for note in timeline.notes)


def test_the_valid_inputs_of_the_fuzz_cases_succeed(tmp_path: Path) -> None:
    """The plan, predict JSON and results.json that the cases break one value at a time are
    accepted whole: every engine exports them, the validation page is written."""
    import yaml

    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(PLAN))
    predicted = tmp_path / "pred.json"
    predicted.write_text(json.dumps({"config": None, "plan": PREDICTED_PLAN}))
    runner = CliRunner()
    for engine in ("megatron", "deepspeed", "torchtitan"):
        for source, extra in ((plan, []), (predicted, ["-w", "gpt3-125m"])):
            result = runner.invoke(app, ["export", str(source), "--to", engine, "--json", *extra])
            assert result.exit_code == 0, result.stderr
            assert json.loads(result.stdout)["world_size"] == 8
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "results.json").write_text(json.dumps(RESULTS))
    result = runner.invoke(app, ["report", "--validation", str(tmp_path / "v"), "-o",
                                 str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.stderr
    assert "c02" in (tmp_path / "r.html").read_text()
