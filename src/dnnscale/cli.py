"""The `dnnscale` command line. Bad input: one line on stderr naming the field, exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from dnnscale.cli_errors import OneLineErrors
from dnnscale.errors import InputError, user_errors
from dnnscale.jsonout import print_json
from dnnscale.plan.flags import WORKLOAD_HELP
from dnnscale.system.commands import (CLUSTER_HELP, INTER_NODE_BANDWIDTH_OPTION,
                                      INTER_NODE_LATENCY_OPTION, INTERCONNECT_OPTION,
                                      NICS_OPTION)

app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Predict DNN training time on a cluster and find the fastest configuration.")

_print_json = print_json  # the name stage commands imported before jsonout existed

INPUT_SHAPE_HELP = ("with -w package.module:factory, one sample's input shape without the "
                    "batch, e.g. 3,224,224 (128:int64 for token ids; ';' between inputs)")


def _version(value: bool) -> None:
    if value:
        from dnnscale import __version__

        print(f"dnnscale {__version__}")
        raise typer.Exit()


@app.callback()
def _global(version: bool = typer.Option(False, "--version", "-V", callback=_version,
                                         is_eager=True, help="print the version and exit"),
            width: Optional[int] = typer.Option(
                None, "--width", min=40, max=10_000,
                help="columns for tables (default: the terminal's; piped: as wide as the "
                     "tables need)")) -> None:
    """Predict DNN training time on a cluster and find the fastest configuration."""
    from dnnscale.report.console import set_width

    set_width(width)


def _console() -> Any:
    from dnnscale.report.console import console

    return console()


@app.command()
@user_errors
def describe(workload: Optional[str] = typer.Argument(
                 None, help="zoo name or workload YAML (omit with --torch)"),
             as_json: bool = typer.Option(False, "--json", help="print JSON"),
             output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                   help="also write the workload as YAML"),
             torch_factory: Optional[str] = typer.Option(
                 None, "--torch", help="import a PyTorch model: package.module:factory "
                 "(a zero-argument callable returning an nn.Module; built on the meta device)"),
             input_shape: Optional[str] = typer.Option(
                 None, "--input-shape", help="with --torch: one sample's input shape without "
                 "the batch, e.g. 3,224,224; 128:int64 for token ids; ';' between inputs"),
             loss: Optional[str] = typer.Option(
                 None, "--loss", help="with --torch: add a loss layer (cross_entropy)"),
             samples_per_epoch: int = typer.Option(
                 1_000_000, "--samples-per-epoch",
                 help="with --torch or --hf-config: samples per epoch"),
             hf_config: Optional[Path] = typer.Option(
                 None, "--hf-config", help="read a local Hugging Face config.json "
                 "(llama, mistral, gpt2, gpt_neox, bert) as a transformer workload"),
             seq: Optional[int] = typer.Option(
                 None, "--seq", help="with --hf-config: sequence length (default: "
                 "max_position_embeddings)")) -> None:
    """Per-layer shapes, parameters, FLOPs per phase and activations of a workload."""
    if output is not None:
        from dnnscale.atomic import check_distinct, check_output_path

        check_output_path(output, "--output")
        check_distinct([("--output", output)], (workload, hf_config))
    from dnnscale.errors import require_int
    from dnnscale.plan.flags import DESCRIBE_FLAGS, PRINT_WORDS, refuse_flags

    refuse_flags(DESCRIBE_FLAGS, {"hf" if hf_config is not None else "torch"
                                  if torch_factory is not None else "zoo"}, PRINT_WORDS)
    require_int("--samples-per-epoch", samples_per_epoch)
    if hf_config is not None:
        if workload is not None or torch_factory is not None:
            raise InputError("--hf-config", "give one of a workload, --torch or --hf-config")
        from dnnscale.workload.hf_config import load_hf_config

        w = load_hf_config(hf_config, seq=seq, samples_per_epoch=samples_per_epoch)
    elif torch_factory is not None:
        if workload is not None:
            raise InputError("workload", "give a workload or --torch, not both")
        if input_shape is None:
            raise InputError("--input-shape", "required with --torch")
        from dnnscale.workload.source import check_factory_spec

        check_factory_spec(torch_factory)
        from dnnscale.workload.torch_import import from_torch, load_factory, parse_input_shapes

        shapes, dtypes = parse_input_shapes(input_shape)
        w = from_torch(load_factory(torch_factory), shapes, name=torch_factory.partition(":")[2],
                       samples_per_epoch=samples_per_epoch, input_dtypes=dtypes, loss=loss)
    else:
        if workload is None:
            raise InputError("workload", "give a zoo name or workload YAML, or --torch, or "
                             "--hf-config")
        from dnnscale.workload.source import load_named

        w = load_named(workload)
    if output is not None:
        from dnnscale.workload.spec import save_workload_yaml

        save_workload_yaml(w, output, "--output")
    if as_json:
        _print_json(workload_json(w))
    else:
        from dnnscale.report.tables import workload_table

        _console().print(workload_table(w))


def workload_json(w: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {"name": w.name, "input_shape": list(w.input_shape),
            "transformer": asdict(w.transformer) if w.transformer is not None else None,
            "samples_per_epoch": w.samples_per_epoch, "bytes_per_value": w.bytes_per_value,
            "layers": [{"name": layer.name, "kind": layer.kind,
                        "input_shape": list(layer.input_shape),
                        "output_shape": list(layer.output_shape), "params": layer.params,
                        "fwd_flops": layer.fwd_flops, "input_grad_flops": layer.input_grad_flops,
                        "weight_grad_flops": layer.weight_grad_flops,
                        "activation_values": layer.activation_values,
                        "activation_bytes": layer.activation_values * w.bytes_per_value,
                        "kept_values": layer.kept_values}
                       for layer in w.layers],
            "totals": {**w.totals(), "activation_values": w.activation_values,
                       "activation_bytes": w.activation_values * w.bytes_per_value}}


@app.command()
@user_errors
def predict(workload: Optional[str] = typer.Option(
                None, "--workload", "-w", help=WORKLOAD_HELP + "; default: the --config plan "
                "file's workload:"),
            cluster: str = typer.Option(..., "--cluster", "-c", help=CLUSTER_HELP),
            config: Optional[Path] = typer.Option(
                None, "--config", help="Adam config or GPU plan YAML (may name its workload:, "
                "as export reads it)"),
            partitions: Optional[int] = typer.Option(None, "--partitions", "-P",
                                                     help="Adam: workers per replica"),
            replicas: Optional[int] = typer.Option(None, "--replicas", "-R",
                                                   help="Adam: data-parallel replicas"),
            ps_shards: Optional[int] = typer.Option(None, "--ps-shards", "-S",
                                                    help="Adam: parameter-server shards"),
            sync: Optional[str] = typer.Option(None, "--sync",
                                               help="ps-async | ps-sync | allreduce"),
            minibatch: Optional[int] = typer.Option(None, "--minibatch", "-n",
                                                    help="Adam: samples per replica and step"),
            push_every: Optional[int] = typer.Option(
                None, "--push-every", help="Adam: steps between a worker's pushes to the PS"),
            pull_every: Optional[int] = typer.Option(
                None, "--pull-every", help="Adam: steps between a worker's pulls from the PS"),
            fc_protocol: Optional[str] = typer.Option(
                None, "--fc-protocol", help="Adam: what FC layers push: weights (gradients) | "
                "vectors (activation and error vectors)"),
            overlap: Optional[bool] = typer.Option(
                None, "--overlap/--no-overlap",
                help="Adam: overlap PS traffic with computation (the cluster's γ-norm)"),
            tp: Optional[int] = typer.Option(None, "--tp", help="GPU: tensor-parallel degree"),
            pp: Optional[int] = typer.Option(None, "--pp", help="GPU: pipeline stages"),
            dp: Optional[int] = typer.Option(None, "--dp", help="GPU: data-parallel replicas"),
            micro_batch: Optional[int] = typer.Option(None, "--micro-batch",
                                                      help="GPU: samples per micro-batch"),
            global_batch: Optional[int] = typer.Option(None, "--global-batch",
                                                       help="GPU: samples per step"),
            schedule: Optional[str] = typer.Option(None, "--schedule",
                                                   help="gpipe | 1f1b | interleaved"),
            virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages",
                                                         help="interleaved: chunks per device"),
            zero: Optional[int] = typer.Option(None, "--zero", help="ZeRO stage 0-3"),
            recompute: Optional[str] = typer.Option(None, "--recompute",
                                                    help="none | selective | full | op"),
            precision: Optional[str] = typer.Option(None, "--precision",
                                                    help="fp32 | tf32 | bf16 | fp16 | fp8"),
            grad_bytes: Optional[int] = typer.Option(
                None, "--grad-bytes", help="GPU: bytes per gradient value accumulated and "
                "reduced: 4 (fp32) | 2 (16-bit); default Megatron's: 4 under bf16 and fp8, 2 "
                "under fp16"),
            sequence_parallel: Optional[bool] = typer.Option(
                None, "--sequence-parallel/--no-sequence-parallel",
                help="GPU: split norms and dropout over the tensor-parallel group too"),
            overlap_dp: Optional[bool] = typer.Option(
                None, "--overlap-dp/--no-overlap-dp",
                help="overlap data-parallel gradients with the backward pass"),
            overlap_tp: Optional[bool] = typer.Option(
                None, "--overlap-tp/--no-overlap-tp",
                help="GPU: run the tensor-parallel all-gathers and reduce-scatters in tp chunks "
                "under the GEMMs (needs --sequence-parallel; Megatron's --tp-comm-overlap)"),
            overlap_tp_method: Optional[str] = typer.Option(
                None, "--overlap-tp-method", help="GPU, --overlap-tp: userbuffers (Transformer "
                "Engine, Megatron: every exchange hidden, the default) | micro_pipeline "
                "(torch's async TP, torchtitan: the backward reduce-scatters after the separate "
                "Q/K/V and gate/up projections stay exposed)"),
            overlap_pp: Optional[bool] = typer.Option(
                None, "--overlap-pp/--no-overlap-pp",
                help="GPU: pipeline sends overlap compute (interleaved schedule only; default "
                "on there, as Megatron runs it)"),
            pp_scatter_gather: Optional[bool] = typer.Option(
                None, "--pp-scatter-gather/--no-pp-scatter-gather",
                help="GPU: each tensor-parallel member sends 1/tp of the pipeline boundary "
                "tensor it holds and the receivers all-gather it (DeepSpeed's default "
                "pipe_partitioned); default off: the tensor it holds whole, as Megatron-Core "
                "sends it"),
            zero3_fetch: Optional[str] = typer.Option(
                None, "--zero3-fetch", help="GPU, --zero 3: blocks (FSDP: one all-gather and "
                "reduce-scatter per transformer block, the default) | buckets (DeepSpeed's "
                "stage 3: prefetch and reduce buckets)"),
            grad_accumulation: Optional[str] = typer.Option(
                None, "--grad-accumulation", help="GPU: how micro-batches' gradients "
                "accumulate: fused (Megatron's gradient-accumulation fusion, the default) | "
                "add (autograd: DDP, FSDP, DeepSpeed, torchtitan) | clip_add (TensorFlow 1 "
                "BERT: each micro-batch clipped, then added in fp32)"),
            loss: Optional[str] = typer.Option(
                None, "--loss", help="GPU: how the loss is computed (its traffic and memory): "
                "inplace (Megatron's vocabulary-parallel cross-entropy, the default) | torch "
                "(torch's cross_entropy on an fp32 cast: torchtitan, Hugging Face) | torch16 (the "
                "same on 16-bit logits, no cast: apex O2) | fused "
                "(flash-attn's kernel: llm-foundry)"),
            amp: Optional[str] = typer.Option(
                None, "--amp", help="GPU, 16-bit plans: how the memory-bound kernels run: half "
                "(the model cast to 16 bits: Megatron, DeepSpeed, torchtitan, the default) | "
                "autocast (torch.autocast over fp32 weights: norms, residual stream and softmax "
                "in fp32) | tf-amp (TensorFlow's AMP graph rewrite: BERT's elementwise ops in "
                "fp32)"),
            ep: Optional[int] = typer.Option(
                None, "--ep", help="GPU: expert-parallel degree (MoE workloads: experts split "
                "over ep devices; the mesh is pp × dp × ep × cp × tp)"),
            cp: Optional[int] = typer.Option(
                None, "--cp", help="GPU: context-parallel degree (each sequence split over cp "
                "devices)"),
            cp_algorithm: Optional[str] = typer.Option(
                None, "--cp-algorithm", help="GPU: ring (ring attention) | alltoall (Ulysses)"),
            expert_imbalance: Optional[float] = typer.Option(
                None, "--expert-imbalance", help="GPU: the busiest ep member's routed tokens "
                "over the mean (1: uniform, the default)"),
            etp: Optional[int] = typer.Option(
                None, "--etp", help="GPU: expert tensor parallelism, the routed experts' tensor "
                "split, a divisor of tp (default: tp)"),
            interconnect: Optional[str] = INTERCONNECT_OPTION,
            inter_node_bandwidth: Optional[str] = INTER_NODE_BANDWIDTH_OPTION,
            inter_node_latency: Optional[str] = INTER_NODE_LATENCY_OPTION,
            nics_per_node: Optional[int] = NICS_OPTION,
            input_shape: Optional[str] = typer.Option(None, "--input-shape",
                                                      help=INPUT_SHAPE_HELP),
            layers: bool = typer.Option(False, "--layers",
                                        help="also print per-layer costs (in JSON: 'layers')"),
            explain: bool = typer.Option(False, "--explain",
                                         help="also print what every row means"),
            html: Optional[Path] = typer.Option(
                None, "--html", help="also write the HTML report (timeline, memory) to FILE"),
            quiet: bool = typer.Option(False, "--quiet", "-q",
                                       help="print nothing but errors (with --html)"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Predict step time, throughput, epoch time and bottleneck of one plan."""
    from dnnscale.boundary import check_prediction, finite_answers
    from dnnscale.model.predict import predict as predict_any
    from dnnscale.plan import check_plan
    from dnnscale.errors import typed_options
    from dnnscale.plan.config import Config
    from dnnscale.plan.flags import PREDICT_OUTPUT_FLAGS, PRINT_WORDS, check_plan_workload, \
        plan_for_devices, plan_from_options, plan_workload, print_notes, read_plan_file, \
        refuse_flags, refuse_sync_flags
    from dnnscale.system.gpu import bare_preset_note
    from dnnscale.system.load import load_cluster
    from dnnscale.workload.source import resolve_workload

    refuse_flags(PREDICT_OUTPUT_FLAGS, {"quiet" if quiet else "json" if as_json else "table"}
                 | ({"writes"} if html is not None else set()), PRINT_WORDS)

    if html is not None:
        from dnnscale.atomic import check_distinct, check_output_path

        check_output_path(html, "--html")
        check_distinct([("--html", html)], (config, (workload or "").removeprefix("hf:"),
                                            cluster))

    adam = dict(partitions=partitions, replicas=replicas, ps_shards=ps_shards, sync=sync,
                minibatch=minibatch, push_every=push_every, pull_every=pull_every,
                fc_protocol=fc_protocol, overlap=overlap)
    plan_fields, file_workload = read_plan_file(config)
    plan = plan_from_options(
        plan_fields, adam,
        dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch,
             schedule=schedule, virtual_stages=virtual_stages, zero=zero, recompute=recompute,
             precision=precision, grad_bytes=grad_bytes, sequence_parallel=sequence_parallel,
             overlap_dp=overlap_dp, ep=ep, cp=cp, cp_algorithm=cp_algorithm,
             expert_imbalance=expert_imbalance, etp=etp, overlap_tp=overlap_tp,
             overlap_tp_method=overlap_tp_method, overlap_pp=overlap_pp, zero3_fetch=zero3_fetch,
             grad_accumulation=grad_accumulation, loss=loss, amp=amp,
             pp_scatter_gather=pp_scatter_gather))
    if isinstance(plan, Config):
        refuse_sync_flags(plan)
    w = resolve_workload(plan_workload(workload, file_workload), input_shape,
                         field="--workload" if workload is not None else "config.workload")
    check_plan_workload(workload, file_workload, w.name)
    c = load_cluster(cluster, dict(interconnect=interconnect, bandwidth=inter_node_bandwidth,
                                   latency=inter_node_latency, nics_per_node=nics_per_node))
    plan = plan_for_devices(plan, c.machine.is_accelerator, config, adam)
    try:
        check_plan(plan, w, c)
    except InputError as exc:  # a PS on accelerators that Adam's other flags chose by default
        typed = typed_options()
        first = next((typed[k] for k, v in adam.items() if v is not None and k in typed), None)
        if exc.field != "config.sync" or sync is not None or first is None:
            raise
        raise InputError(first, "Project Adam's flags build a parameter-server plan, which is "
                         "not priced on accelerators; give the GPU plan's flags (--tp, --pp, "
                         "--dp, ...) or --sync allreduce") from None
    prediction = check_prediction(finite_answers("predict")(predict_any)(
        w, c, plan, per_layer=layers or html is not None))
    if html is not None:
        from dnnscale.report.pages import prediction_page, write_html

        write_html(prediction_page(prediction, w, c), html)
    if quiet:
        return
    print_notes(bare_preset_note(cluster), c.shared_host_note(prediction.plan.machines))
    if as_json:
        _print_json(prediction.to_dict(with_layers=layers))
        return
    from dnnscale.report.explain import epoch_text
    from dnnscale.report.tables import explain_table, layer_table, prediction_table

    console = _console()
    console.print(prediction_table(prediction, w.name, c.name,
                                   epoch_text(w, prediction.plan)))
    if layers:
        console.print(layer_table(prediction))
    if explain:
        console.print(explain_table(prediction))
    if html is not None:
        console.print(f"report written to {html}")
    if not c.calibrated:
        console.print(f"[yellow]note:[/yellow] cluster {c.name!r} uses uncalibrated "
                      f"{'efficiencies' if c.machine.is_accelerator else 'compute rates'}")
    if not prediction.fits:
        console.print(f"[red]does not fit:[/red] {prediction.overflow()}")


# Each stage that has commands of its own keeps them in `<stage>/commands.py`, which defines
# `register(app)`; importing it must stay cheap (no torch at import time).
_COMMAND_MODULES = ("dnnscale.optimize.commands", "dnnscale.runtime.commands",
                    "dnnscale.testbed.commands", "dnnscale.calibrate.commands",
                    "dnnscale.validate.commands", "dnnscale.report.commands",
                    "dnnscale.export.commands")


def _register_stage_commands() -> None:
    from importlib import import_module
    from importlib.util import find_spec

    for name in _COMMAND_MODULES:
        if find_spec(name) is not None:
            import_module(name).register(app)


_register_stage_commands()


def main() -> None:
    """The command line without the program's edge (dnnscale.entry, the `dnnscale` script and
    `python -m dnnscale`, which owns Ctrl-C and stdout failures and calls this app)."""
    app()


if __name__ == "__main__":  # `python -m dnnscale.cli`: the program, edge included
    import runpy

    runpy.run_module("dnnscale", run_name="__main__")
