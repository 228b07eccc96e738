"""`dnnscale run`: real distributed training of a workload under a configuration.

Cheap to import (no torch): the command imports the runtime when it runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from dnnscale.errors import InputError, require_int, require_positive, short_repr, user_errors


MAX_LOCAL_RANKS = 64
"""The most ranks `run --local` starts (each is a process with its own copy of the model)."""

CONV_SPLITS = ("channels", "rows", "model")
RANKS = ("local", "testbed", "rank-from-env")
MODE_FLAGS: dict[str, tuple[str, ...]] = {
    **{flag: ("gpu",) for flag in ("--device", "--micro-batch", "--global-batch", "--recompute",
                                   "--precision", "--bf16-mode")},
    **{flag: RANKS for flag in ("--input-shape", "--partitions", "--replicas", "--ps-shards",
                                "--sync", "--minibatch", "--push-every", "--pull-every",
                                "--fc-protocol", "--overlap", "--epoch-fraction", "--timeout",
                                "--conv-split", "--cluster")},
}
"""run's flags by how it runs (plan/flags.py refuse_flags): one GPU, or ranks of
torch.distributed (--local, --testbed, --rank-from-env); the rest apply to all."""
SPLIT_FLAGS: dict[str, tuple[str, ...]] = {"--cluster": ("model",)}
"""--cluster only prices --conv-split model."""
WORDS = {**{mode: "to torch.distributed runs (--local, --testbed, --rank-from-env)"
            for mode in RANKS}, "gpu": "with --gpu", "model": "with --conv-split model"}


def register(app: typer.Typer) -> None:
    app.command("run")(user_errors(run))


def run(workload: str = typer.Option(..., "--workload", "-w",
                                     help="zoo name, YAML, or package.module:factory (with "
                                          "--input-shape; conv2d, linear, pooling, relu and "
                                          "flatten layers)"),
        input_shape: Optional[str] = typer.Option(
            None, "--input-shape", help="with -w package.module:factory, one sample's input "
            "shape without the batch, e.g. 3,32,32"),
        config: Optional[Path] = typer.Option(None, "--config", help="config YAML"),
        partitions: Optional[int] = typer.Option(None, "--partitions", "-P",
                                                 help="workers per replica"),
        replicas: Optional[int] = typer.Option(None, "--replicas", "-R",
                                               help="data-parallel replicas"),
        ps_shards: Optional[int] = typer.Option(None, "--ps-shards", "-S",
                                                help="parameter-server shards"),
        sync: Optional[str] = typer.Option(None, "--sync", help="ps-async | ps-sync | allreduce"),
        minibatch: Optional[int] = typer.Option(None, "--minibatch", "-n",
                                                help="samples per replica and step"),
        push_every: Optional[int] = typer.Option(None, "--push-every",
                                                 help="steps between a worker's pushes"),
        pull_every: Optional[int] = typer.Option(None, "--pull-every",
                                                 help="steps between a worker's pulls"),
        fc_protocol: Optional[str] = typer.Option(
            None, "--fc-protocol", help="weights | vectors (Adam: FC layers push their input "
                                        "and error vectors, the PS forms the outer products)"),
        overlap: Optional[bool] = typer.Option(
            None, "--overlap/--no-overlap", help="push/pull in a background thread while the "
                                                 "next step computes (PS modes)"),
        epoch_fraction: Optional[float] = typer.Option(
            None, "--epoch-fraction", help="ps-async: end the epoch when this fraction of the "
                                           "timed steps is done (stragglers cut off)"),
        local: bool = typer.Option(False, "--local", help="all ranks on this machine (loopback)"),
        testbed: Optional[Path] = typer.Option(None, "--testbed",
                                               help="testbed description file: ranks on its hosts"),
        rank_from_env: bool = typer.Option(False, "--rank-from-env",
                                           help="this process is one rank (RANK, WORLD_SIZE, "
                                                "MASTER_ADDR, MASTER_PORT), e.g. under torchrun"),
        gpu: bool = typer.Option(False, "--gpu", help="train a transformer on one CUDA GPU "
                                 "(bf16, AdamW; the GPU plan flags below)"),
        device: str = typer.Option("cuda", "--device", help="--gpu: cuda or cuda:N"),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch",
                                                  help="--gpu: samples per micro-batch"),
        global_batch: Optional[int] = typer.Option(None, "--global-batch",
                                                   help="--gpu: samples per step"),
        recompute: Optional[str] = typer.Option(None, "--recompute", help="--gpu: none | full"),
        precision: Optional[str] = typer.Option(None, "--precision",
                                                help="--gpu: bf16 | tf32 | fp32"),
        bf16_mode: str = typer.Option("master", "--bf16-mode",
                                      help="--gpu: master (bf16 weights, fp32 master copy) | "
                                           "autocast (fp32 weights, torch.autocast)"),
        steps: int = typer.Option(20, "--steps", help="training steps per worker"),
        warmup: int = typer.Option(2, "--warmup", help="steps left out of the throughput"),
        timeout: float = typer.Option(60.0, "--timeout",
                                      help="seconds a rank may wait on a peer or stay silent"),
        conv_split: str = typer.Option("channels", "--conv-split",
                                       help="how P workers split conv layers: channels | rows "
                                            "(horizontal stripes with halo exchange) | model "
                                            "(each layer as the model picks for --cluster)"),
        cluster: Optional[str] = typer.Option(None, "--cluster", "-c",
                                              help="preset or YAML, for --conv-split model"),
        lr: Optional[float] = typer.Option(None, "--lr", help="learning rate (SGD: 0.1; "
                                           "--gpu AdamW: 3e-4)"),
        seed: int = typer.Option(0, "--seed", help="seed of weights and data"),
        output: Optional[Path] = typer.Option(None, "-o", "--output",
                                              help="JSONL file: one record per step and rank"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Train WORKLOAD for real on torch.distributed and measure throughput and phase times."""
    from dnnscale.plan.flags import config_from_options, refuse_flags, refuse_sync_flags
    from dnnscale.workload.source import resolve_workload

    modes = [name for name, on in (("--local", local), ("--testbed", testbed is not None),
                                   ("--rank-from-env", rank_from_env), ("--gpu", gpu)) if on]
    if len(modes) != 1:
        raise InputError("run", "choose exactly one of --local, --testbed FILE, "
                         "--rank-from-env, --gpu")
    refuse_flags(MODE_FLAGS, {modes[0][2:]}, WORDS, f"not with {modes[0]}")
    refuse_flags(SPLIT_FLAGS, {conv_split}, WORDS)
    if conv_split not in CONV_SPLITS:  # a workload without conv layers would never look
        raise InputError("--conv-split", f"must be one of {', '.join(CONV_SPLITS)}, got "
                         f"{short_repr(conv_split)}")
    gpu_flags = dict(micro_batch=micro_batch, global_batch=global_batch, recompute=recompute,
                     precision=precision)
    if gpu:
        _run_gpu(workload, config, gpu_flags, device, bf16_mode, steps, warmup, lr, seed,
                 output, as_json)
        return
    lr = 0.1 if lr is None else lr
    require_int("--steps", steps)
    require_int("--warmup", warmup, minimum=0)
    if warmup >= steps:
        raise InputError("--warmup", f"must be less than --steps ({steps}), got {warmup}")
    require_positive("--timeout", timeout)
    require_positive("--lr", lr)
    if output is not None:
        from dnnscale.atomic import check_output_path

        check_output_path(output, "--output")
    cfg = config_from_options(config, partitions=partitions, replicas=replicas,
                              ps_shards=ps_shards, sync=sync, minibatch=minibatch,
                              push_every=push_every, pull_every=pull_every,
                              fc_protocol=fc_protocol, overlap=overlap,
                              epoch_fraction=epoch_fraction)
    refuse_sync_flags(cfg)
    w = resolve_workload(workload, input_shape, field="--workload")
    from dnnscale.runtime.layout import world_size
    from dnnscale.runtime.netplan import check_runnable, weighted_schemes

    if local and world_size(cfg) > MAX_LOCAL_RANKS:
        raise InputError("config", f"--local runs each of the P·R + S = {world_size(cfg):,} "
                         f"ranks as a process on this machine; at most {MAX_LOCAL_RANKS}")

    split = _conv_split(conv_split, cluster, w, cfg)
    check_runnable(w, cfg, weighted_schemes(w, split))
    from dnnscale.runtime.job import RunSpec

    workload_ref = workload
    if input_shape is not None:  # the ranks load workloads by name or path: write its YAML
        import atexit
        import shutil

        from dnnscale.workload.spec import save_workload_yaml

        folder = tempfile.mkdtemp(prefix="dnnscale-model-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        workload_ref = os.path.join(folder, "workload.yaml")
        save_workload_yaml(w, Path(workload_ref), "--workload")

    def spec_for(out: str) -> Any:
        return RunSpec(workload=workload_ref, config=cfg.to_dict(), steps=steps, warmup=warmup,
                       timeout_s=float(timeout), output=out, lr=lr, seed=seed, conv_split=split)

    if rank_from_env:
        summary = _run_from_env(spec_for, output)
        if summary is None:
            return
    else:
        from dnnscale.runtime.launch import RunFailed, launch
        from dnnscale.runtime.layout import rank_roles

        placements = _placements(testbed, [role.kind for role in rank_roles(cfg)])
        if output is None:
            with tempfile.TemporaryDirectory(prefix="dnnscale-out-") as tmp:
                summary = launch(spec_for(os.path.join(tmp, "run.jsonl")), placements)
        else:
            # The records go to OUTPUT.partial while the run lasts (follow it live); it
            # replaces OUTPUT when the run ends, or fails with its error record last. Ctrl-C
            # or any other failure removes it: an existing OUTPUT is never truncated or
            # half-written.
            from dnnscale.atomic import atomic_output

            with atomic_output(output, "--output", partial=True, keep_on=(RunFailed,)) as temp:
                summary = launch(spec_for(str(temp)), placements)
    _print_summary(summary, as_json)


def _run_gpu(workload: str, config: Optional[Path], plan_flags: dict[str, Any], device: str,
             bf16_mode: str, steps: int, warmup: int, lr: Optional[float], seed: int,
             output: Optional[Path], as_json: bool) -> None:
    """`run --gpu`: runtime/gpu_commands.py (`run` has refused the flags that mean ranks)."""
    from dnnscale.runtime.gpu_commands import gpu_spec, run_gpu

    spec = gpu_spec(workload, config, plan_flags, bf16_mode=bf16_mode, steps=steps,
                    warmup=warmup, seed=seed, **({"lr": lr} if lr is not None else {}))
    run_gpu(spec, device, output, as_json)


def _conv_split(conv_split: str, cluster: Optional[str], workload: Any,
                config: Any) -> "str | dict[str, str]":
    """'channels' / 'rows' as given, or with 'model' the split the predictor picks per layer."""
    if conv_split != "model":
        if cluster is not None:
            raise InputError("--cluster", "only applies with --conv-split model")
        return conv_split
    if cluster is None:
        raise InputError("--cluster", "--conv-split model needs --cluster")
    from dnnscale.system import load_system
    from dnnscale.model.stage import stage_costs

    c = load_system(cluster)
    costs = stage_costs(workload, c, config.partitions, config.minibatch,
                          config.fc_protocol)
    return {layer.name: layer.scheme for layer in costs.layers if layer.kind == "conv2d"}


def _placements(testbed: Optional[Path], roles: list[str]) -> list[Any]:
    """Where each rank runs: loopback, or the testbed host for its role ('worker' | 'ps')."""
    if testbed is None:
        from dnnscale.runtime.placement import local_placements

        return local_placements(len(roles))
    try:
        from dnnscale.testbed.describe import rank_placements  # type: ignore[import-not-found]
    except ImportError:
        raise InputError("run.testbed", "testbed placement is not available in this build "
                         "(dnnscale.testbed.describe.rank_placements is missing)") from None
    return list(rank_placements(testbed, len(roles), roles=roles, join_late=True))


def _run_from_env(spec_for: Any, output: Optional[Path]) -> dict[str, Any] | None:
    """One rank under an external launcher; rank 0 returns the summary.

    Every rank appends to OUTPUT.partial (emptied by each node's local rank 0 first); after
    the run's last barrier, when nobody writes any more, local rank 0 renames it to OUTPUT."""
    from dnnscale.atomic import finish_partial, partial_path

    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    except (KeyError, ValueError) as exc:
        raise InputError("run.rank-from-env", f"needs RANK, WORLD_SIZE, MASTER_ADDR and "
                         f"MASTER_PORT in the environment ({exc} missing or bad)") from None
    local_zero = os.environ.get("LOCAL_RANK", "0") == "0"
    with tempfile.TemporaryDirectory(prefix="dnnscale-out-") as tmp:
        out = partial_path(output) if output is not None else Path(tmp) / "run.jsonl"
        summary = _env_rank(spec_for(str(out)), rank, world, local_zero or output is None)
        if output is not None and local_zero:
            finish_partial(out, output, "--output")  # renamed over a file, or into a pipe
    return summary


def _env_rank(spec: Any, rank: int, world: int, truncate: bool) -> dict[str, Any] | None:
    from dnnscale.runtime.launch import RunFailed
    from dnnscale.runtime.layout import world_size
    from dnnscale.runtime.rank import run_rank

    needed = world_size(spec.config_obj())
    if world != needed:
        raise InputError("run.rank-from-env", f"WORLD_SIZE is {world} but the config needs "
                         f"{needed} ranks (P·R + S)")
    try:
        return run_rank(spec, rank, world, "env://", truncate_output=truncate)
    except Exception as exc:  # noqa: BLE001 - becomes a one-line error and exit 1
        raise RunFailed(f"rank {rank} failed: {type(exc).__name__}: {exc}") from exc


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        from dnnscale.jsonout import print_json

        print_json(summary)
        return
    phases = ", ".join(f"{name} {seconds * 1e3:.2f} ms"
                       for name, seconds in summary["per_phase_s"].items() if seconds)
    print(f"{summary['workload']}: {summary['steps']} steps, "
          f"{summary['measured_throughput_samples_per_s']:.1f} samples/s after warm-up, "
          f"loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}")
    print(f"per step: {phases}")
    epoch = summary.get("epoch")
    if epoch and epoch.get("cut_off"):
        print(f"epoch cut off at {epoch['target_steps']} replica-steps after "
              f"{epoch['epoch_time_s']:.3f} s ({epoch['throughput_samples_per_s']:.1f} "
              f"samples/s); steps by replica: {epoch['steps_by_replica']}")
