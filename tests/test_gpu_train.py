"""`dnnscale run --gpu`: the GPT module matches its workload, the training code runs on the CPU
(fp32), the optimizers do AdamW's arithmetic, the command refuses clearly, and on a CUDA machine
it trains for real."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from dnnscale.cli import app  # noqa: E402
from dnnscale.errors import InputError  # noqa: E402
from dnnscale.runtime.gpt_model import GptModel, parameter_count  # noqa: E402
from dnnscale.runtime.gpu_optim import MasterAdamW, PlainAdamW  # noqa: E402
from dnnscale.runtime.gpu_train import GpuTrainSpec, train_gpu  # noqa: E402
from dnnscale.runtime.records import SUMMARY_KEYS  # noqa: E402
from dnnscale.workload import load_workload  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() "
                                                 "is False here)")
TINY = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100"
CPU = torch.device("cpu")


def test_module_parameters_by_hand():
    # V·h + s·h + L·(h·3h + 3h + h² + h + 4h·h + 4h + 4h·h + h + 4h [two LayerNorms]) + 2h
    # = 6400 + 2048 + 2·(49,152 + 832) + 128 = 108,544
    model = GptModel(load_workload(TINY).transformer)
    assert parameter_count(model) == 108_544


@pytest.mark.parametrize("name", [
    TINY, TINY + ",flash=true,dropout=false",
    "gpt:layers=2,hidden=64,heads=4,kv_heads=2,seq=32,vocab=100,gated=true,norm=rmsnorm,"
    "positional=rope,bias=false,tied=false",
    "gpt3-125m", "llama2-7b", "bert-large"])
def test_module_has_the_workloads_parameters(name):
    workload = load_workload(name)
    with torch.device("meta"):
        model = GptModel(workload.transformer)
    assert parameter_count(model) == workload.params


def test_attention_dropout_is_its_own_probability():
    # attention_dropout=false: the blocks' attention runs no dropout, their residual adds do
    from dnnscale.runtime.gpt_model import DROPOUT_P
    model = GptModel(load_workload(TINY + ",attention_dropout=false").transformer)
    assert all((b.dropout_p, b.attention_dropout_p) == (DROPOUT_P, 0.0) for b in model.blocks)
    only = GptModel(load_workload(TINY + ",dropout=false,attention_dropout=true").transformer)
    assert all((b.dropout_p, b.attention_dropout_p) == (0.0, DROPOUT_P) for b in only.blocks)
    # with the attention's dropout off and the hidden one off too, two forward passes in
    # training mode give one loss (nothing is drawn at random)
    quiet = GptModel(load_workload(TINY + ",dropout=false").transformer)
    tokens = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    assert quiet(tokens, tokens).item() == quiet(tokens, tokens).item()


def test_eager_rmsnorm_module_is_torchs_rmsnorm_op_by_op():
    # eager=true builds the op-by-op module, with the parameters of nn.RMSNorm and its
    # values (eps 1e-6) on bf16 input, in the input's dtype
    from dnnscale.runtime.gpt_model import OpByOpRMSNorm
    name = ("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100,norm=rmsnorm,positional=rope,"
            "gated=true,bias=false")
    model = GptModel(load_workload(name + ",eager=true").transformer)
    assert all(isinstance(b.attn_norm, OpByOpRMSNorm) for b in model.blocks)
    assert parameter_count(model) == parameter_count(GptModel(load_workload(name).transformer))
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    eager = OpByOpRMSNorm(64).to(torch.bfloat16)
    reference = torch.nn.RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    assert eager(x).dtype == torch.bfloat16
    assert torch.allclose(eager(x).float(), reference(x).float(), atol=2e-2)


def test_module_forward_on_meta_at_full_size():
    shape = load_workload("gpt3-125m").transformer
    with torch.device("meta"):
        model = GptModel(shape, recompute=True)
        tokens = torch.empty((2, shape.seq), dtype=torch.long)
        loss = model(tokens, tokens)
    assert loss.shape == ()


def _spec(**changes):
    base = dict(workload=TINY, micro_batch=2, global_batch=4, precision="fp32", steps=3,
                warmup=1, lr=1e-2)
    return GpuTrainSpec(**{**base, **changes})


def test_cpu_smoke_training_loss_falls_and_records_match_the_cpu_runtime():
    records = []
    summary = train_gpu(_spec(), load_workload(TINY), CPU, records.append)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert summary["loss_last"] < summary["loss_first"]
    # the loss starts near ln(V) = ln 100 = 4.605 (N(0, 0.02²) weights, uniform guesses)
    assert summary["loss_first"] == pytest.approx(math.log(100), abs=0.1)
    worker_keys = {"type", "rank", "role", "replica", "partition", "step", "loss", "samples",
                   "t_start_s", "t_end_s", "step_s", "compute_s", "partition_comm_s",
                   "ps_push_s", "ps_pull_s", "allreduce_s"}
    assert all(worker_keys <= set(r) for r in records)
    assert all(r["samples"] == 4 and r["tokens"] == 4 * 32 for r in records)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["config"]["micro_batch"] == 2 and summary["config"]["global_batch"] == 4
    timed = [r["step_s"] for r in records[1:]]
    assert summary["step_time_s"] == pytest.approx(sorted(timed)[len(timed) // 2]
                                                   if len(timed) % 2 else sum(timed) / 2)
    assert summary["tokens_per_s"] == pytest.approx(4 * 32 / summary["step_time_s"])
    json.dumps(summary)  # plain JSON


@pytest.mark.parametrize("workload", [TINY, TINY + ",dropout=false"])
def test_recompute_changes_no_number(workload):
    plain = [r["loss"] for r in _records(_spec(workload=workload))]
    recomputed = [r["loss"] for r in _records(_spec(workload=workload, recompute="full"))]
    assert recomputed == pytest.approx(plain, rel=1e-5)


def test_accumulation_computes_the_same_step():
    # 2 micro-batches of 2 or 1 of 4: the same 4 sequences (drawn in the same order), the
    # same mean loss and gradient, so the same losses step after step
    name = TINY + ",dropout=false"
    two = [r["loss"] for r in _records(_spec(workload=name, micro_batch=2))]
    one = [r["loss"] for r in _records(_spec(workload=name, micro_batch=4))]
    assert two == pytest.approx(one, rel=1e-4)


def _records(spec):
    out = []
    train_gpu(spec, load_workload(spec.workload), CPU, out.append)
    return out


def test_spec_validation_names_the_field():
    with pytest.raises(InputError, match="run.global_batch"):
        _spec(global_batch=5)
    with pytest.raises(InputError, match="run.recompute"):
        _spec(recompute="selective")
    with pytest.raises(InputError, match="run.warmup"):
        _spec(warmup=3)
    with pytest.raises(InputError, match="bf16 runs need a GPU"):
        train_gpu(_spec(precision="bf16"), load_workload(TINY), CPU)


# --- the optimizers -----------------------------------------------------------------------------


def test_first_adamw_step_by_hand():
    # AdamW's first step: m̂ = g, v̂ = g², so p ← p·(1 − lr·wd) − lr·g/(|g| + ε):
    # p = 1, g = 0.5 (norm 0.5 < 1: no clipping), lr 0.01, wd 0.1: 0.999 − 0.01 = 0.989
    p = torch.nn.Parameter(torch.ones(1))
    optimizer = PlainAdamW([p], lr=0.01)
    p.grad = torch.full((1,), 0.5)
    optimizer.step()
    assert float(p.detach()) == pytest.approx(0.989, abs=1e-6)


def test_master_weights_keep_fp32_and_write_bf16():
    a = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    b = torch.nn.Parameter(torch.full((2, 2), -1.0, dtype=torch.bfloat16))
    optimizer = MasterAdamW([a, b], lr=0.01)
    assert a.data.data_ptr() == optimizer.flat.data_ptr()      # views of one flat buffer
    a.grad = torch.full((3,), 0.1, dtype=torch.bfloat16)
    b.grad = torch.full((2, 2), -0.1, dtype=torch.bfloat16)
    optimizer.step()
    # global norm √(7·0.01) = 0.2646 < 1, so no clipping; the first step moves each weight by
    # lr against its gradient's sign, after decay: 1·0.999 − 0.01, −1·0.999 + 0.01
    assert optimizer.master[:3].tolist() == pytest.approx([0.989] * 3, abs=1e-6)
    assert optimizer.master[3:].tolist() == pytest.approx([-0.989] * 4, abs=1e-6)
    assert a.dtype == torch.bfloat16
    assert a.tolist() == [torch.tensor(0.989).bfloat16().item()] * 3
    optimizer.zero_grad()
    assert a.grad is None and b.grad is None


def test_clipping_scales_the_global_norm_to_one():
    # g = (3, 4): norm 5 -> scaled to (0.6, 0.8); Adam's first step is still lr·sign(g)
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = PlainAdamW([p], lr=0.1)
    p.grad = torch.tensor([3.0, 4.0])
    optimizer.step()
    assert p.grad.tolist() == pytest.approx([0.6, 0.8], rel=1e-5)
    assert p.tolist() == pytest.approx([-0.1, -0.1], rel=1e-5)


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU")
def test_run_gpu_refuses_without_cuda(tmp_path):
    out = tmp_path / "run.jsonl"
    result = CliRunner().invoke(app, ["run", "-w", TINY, "--gpu", "--micro-batch", "2",
                                      "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr == ("error: --gpu: no CUDA device (torch.cuda.is_available() is "
                             "False)\n")
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["-w", "adam-mnist", "--gpu"], "--workload: 'adam-mnist' is not a transformer workload"),
    (["-w", TINY, "--gpu", "-P", "2"], "--partitions: only applies to torch.distributed runs "
                                       "(--local, --testbed, --rank-from-env); not with --gpu"),
    (["-w", TINY, "--gpu", "--timeout", "0"], "--timeout: only applies to torch.distributed"),
    (["-w", TINY, "--gpu", "--conv-split", "rows"], "--conv-split: only applies to torch"),
    (["-w", TINY, "--gpu", "--local"], "choose exactly one of --local, --testbed FILE, "
                                       "--rank-from-env, --gpu"),
    (["-w", TINY, "--local", "--micro-batch", "2"], "--micro-batch: only applies with --gpu; "
                                                    "not with --local"),
    (["-w", TINY, "--gpu", "--recompute", "selective"], "--recompute: must be one of none, "
                                                        "full"),
    (["-w", TINY, "--gpu", "--precision", "fp16"], "--precision: must be one of bf16, tf32, "
                                                   "fp32"),
    (["-w", TINY, "--gpu", "--micro-batch", "3", "--global-batch", "4"],
     "--global-batch: 4 is not a multiple"),
    (["-w", TINY, "--gpu", "--device", "tpu"], "--device: must be cuda or cuda:N"),
])
def test_run_gpu_input_errors(args, message):
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_run_gpu_plan_file_must_be_one_gpu(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 2\nmicro_batch: 2\n")
    result = CliRunner().invoke(app, ["run", "-w", TINY, "--gpu", "--config", str(plan)])
    assert result.exit_code == 2
    assert "plan.tp: run --gpu trains on one GPU: must be 1, got 2" in result.stderr


def test_gpu_spec_reads_the_plan_file(tmp_path):
    from dnnscale.runtime.gpu_commands import gpu_spec

    plan = tmp_path / "plan.yaml"
    plan.write_text("micro_batch: 2\nglobal_batch: 8\nrecompute: full\n")
    spec = gpu_spec(TINY, plan, {"micro_batch": 4})
    assert (spec.micro_batch, spec.global_batch, spec.recompute, spec.precision) == \
        (4, 8, "full", "bf16")



def test_the_run_records_and_requires_autograd_accumulation(tmp_path):
    """The run adds its micro-batches' gradients through autograd in the weights' width and
    computes its loss on an fp32 cast: the plan it records (and a calibration fit prices) says
    so; a plan file asking for Megatron's fused accumulation or in-place loss is refused,
    naming the field."""
    from dnnscale.runtime.gpu_commands import gpu_spec
    from dnnscale.runtime.gpu_train import single_gpu_plan

    plan = single_gpu_plan(2, 8, "none", "bf16")
    assert (plan["grad_accumulation"], plan["grad_bytes"]) == ("add", 2)
    assert single_gpu_plan(2, 8, "none", "fp32")["grad_bytes"] == 4
    path = tmp_path / "plan.yaml"
    path.write_text("micro_batch: 2\nglobal_batch: 8\ngrad_accumulation: fused\n")
    with pytest.raises(InputError) as raised:
        gpu_spec(TINY, path, {})
    assert raised.value.field == "plan.grad_accumulation"
    assert plan["loss"] == "torch"
    path.write_text("micro_batch: 2\nglobal_batch: 8\nloss: inplace\n")
    with pytest.raises(InputError) as raised:
        gpu_spec(TINY, path, {})
    assert raised.value.field == "plan.loss"


# --- on a real GPU -------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("precision, mode", [("bf16", "master"), ("bf16", "autocast"),
                                             ("tf32", "master")])
def test_cuda_training_runs(precision, mode):
    spec = _spec(workload=TINY + ",flash=true", precision=precision, bf16_mode=mode)
    summary = train_gpu(spec, load_workload(spec.workload), torch.device("cuda"))
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["peak_memory_bytes"] > 0


@needs_cuda
def test_cuda_run_command(tmp_path):
    out = tmp_path / "run.jsonl"
    result = CliRunner().invoke(app, ["run", "-w", TINY + ",flash=true", "--gpu", "--steps", "4",
                                      "--warmup", "1", "--micro-batch", "2", "-o", str(out),
                                      "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["start", "step", "step", "step", "step", "summary"]


def test_run_gpu_command_with_the_device_faked(tmp_path, monkeypatch):
    """The command's plumbing (plan flags, records file, summary) with the CUDA check faked to
    hand out the CPU (fp32, as a CPU run must be)."""
    import dnnscale.runtime.cuda as cuda

    monkeypatch.setattr(cuda, "cuda_device", lambda text, flag="--gpu": CPU)
    out = tmp_path / "run.jsonl"
    result = CliRunner().invoke(app, ["run", "-w", TINY, "--gpu", "--precision", "fp32",
                                      "--micro-batch", "2", "--global-batch", "4", "--steps",
                                      "3", "--warmup", "1", "--lr", "0.01", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{TINY}: 3 steps on ")
    assert "tokens/s" in result.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["start", "step", "step", "step", "summary"]
    assert lines[-1]["config"] == {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2,
                                   "global_batch": 4, "recompute": "none", "precision": "fp32",
                                   "grad_bytes": 4, "grad_accumulation": "add",
                                   "loss": "torch"}
    assert lines[-1]["spec"]["lr"] == 0.01
