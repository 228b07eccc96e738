"""The validity rules of a plan: the one module that plan loading (plan/modern.py,
plan/config.py), the search spaces (optimize/modern.py, optimize/space.py) and the runtime
(runtime/netplan.py) call, so that every plan the search returns is one `predict` accepts.

Each rule is a small function that returns a `Violation` (the plan field at fault and why) or
None. Loading turns a violation into an InputError naming the field (`Violation.error`); the
searches skip the choices a rule rejects. Rules are facts about divisibility, schedules, the
devices and the units a split divides; memory fit is a price (model/memory.py), not a rule, and
what only dnnscale's own runtime cannot run (layer kinds, SGD only) stays in runtime/netplan.py.

Megatron-style plans (Shoeybi et al. 2019; Narayanan et al. SC'21):

- tp divides the attention heads and the key/value heads (query groups);
- pp · v divides the layers (v virtual stages per device, the interleaved schedule only);
- the global batch B is a multiple of dp · ep · b (b the micro-batch; the ep members take
  different samples);
- ep divides the routed experts (ep = 1 for a dense model) and the load imbalance is at most
  ep; cp > 1 needs fused attention, s divisible by 2 · cp for ring attention and cp · tp
  dividing the heads for the all-to-all (Ulysses) variant;
- the interleaved schedule needs pp ≥ 2 and v ≥ 2, and micro-batches m = B / (dp · b) a
  multiple of pp (Megatron-LM's rule);
- ZeRO-2/3 partition gradients, which pipeline parallelism cannot accumulate over micro-batches
  (DeepSpeed allows ZeRO-1 with pp > 1);
- tp · pp · dp · ep · cp devices within the cluster, and a precision the device has units for;
- sequence parallelism splits over the tensor group: with tp = 1 it changes nothing (Megatron-LM
  turns it off), so a search does not offer it as a distinct plan.

Project Adam's plans (performance-model.md §2): a global step R · n within one epoch, P within
the narrowest weighted layer's widest split (each split layer a unit per partition), P · R + S
machines (or dedicated PS hosts), S = 0 exactly with all-reduce, each shard a non-empty slice of
the parameters, and the vector protocol only with a parameter server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dnnscale.errors import InputError
from dnnscale.plan.plan import USERBUFFERS, ParallelPlan
from dnnscale.system.system import System
from dnnscale.workload.layer import Layer
from dnnscale.workload.splits import max_split, split_extent, split_schemes
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload


class AdamFlags(Protocol):
    """What the rules read of Adam's flags (plan/config.Config, which itself calls the rules of
    its fields here, so this module does not import it)."""

    @property
    def partitions(self) -> int: ...
    @property
    def replicas(self) -> int: ...
    @property
    def ps_shards(self) -> int: ...
    @property
    def minibatch(self) -> int: ...
    @property
    def uses_ps(self) -> bool: ...
    @property
    def workers(self) -> int: ...
    @property
    def machines(self) -> int: ...


@dataclass(frozen=True)
class Violation:
    """A rule a plan breaks: `field`, the plan field at fault relative to the plan ('pp',
    'global_batch'; '' for the plan as a whole), and `message`, why."""

    field: str
    message: str

    def error(self, where: str = "plan") -> InputError:
        """The InputError naming `where`.`field` (or `where` alone for the whole plan)."""
        name = f"{where}.{self.field}" if where and self.field else (where or self.field)
        return InputError(name, self.message)


def require(violation: Violation | None, where: str = "plan") -> None:
    """Raise the violation's InputError, if there is one."""
    if violation is not None:
        raise violation.error(where)


# --- Megatron-style plans ----------------------------------------------------------------------

def tensor_divides_heads(tp: int, shape: TransformerShape) -> Violation | None:
    """tp divides the attention heads and the key/value heads (each member holds whole heads)."""
    for count, what in ((shape.heads, "attention heads"), (shape.kv_heads, "key/value heads")):
        if count % tp:
            return Violation("tp", f"{tp} does not divide the model's {count} {what}")
    return None


def pipeline_divides_layers(pp: int, virtual_stages: int, layers: int) -> Violation | None:
    """pp · v divides the transformer's layers (every chunk holds the same number of blocks)."""
    if layers % (pp * virtual_stages):
        return Violation("pp", f"{layers} layers do not divide into {pp} stages"
                         + (f" × {virtual_stages} chunks" if virtual_stages > 1 else ""))
    return None


def pipeline_within_layers(pp: int, layers: int) -> Violation | None:
    """At most one stage per layer (a workload that is not a transformer)."""
    if pp > layers:
        return Violation("pp", f"{pp} stages for {layers} layers")
    return None


def batch_divides(global_batch: int, dp: int, micro_batch: int) -> Violation | None:
    """The global batch B is a whole number of micro-batches per replica: dp · b divides B."""
    if global_batch % (dp * micro_batch):
        return Violation("global_batch", f"{global_batch} is not a multiple of dp × "
                         f"micro_batch = {dp} × {micro_batch}")
    return None


def schedule_virtual_stages(schedule: str, pp: int, virtual_stages: int) -> Violation | None:
    """Only the interleaved schedule has virtual stages, and it needs pp ≥ 2 and v ≥ 2."""
    if schedule != "interleaved":
        if virtual_stages != 1:
            return Violation("virtual_stages", f"only the interleaved schedule has virtual "
                             f"stages (got {virtual_stages} with {schedule})")
        return None
    if pp < 2 or virtual_stages < 2:
        return Violation("schedule", "interleaved needs pp >= 2 and virtual_stages >= 2")
    return None


def tensor_overlap_needs_sequence_parallel(overlap: bool, tp: int,
                                           sequence_parallel: bool) -> Violation | None:
    """Overlapping the tensor-parallel exchanges with the GEMMs chunks the sequence-parallel
    all-gathers and reduce-scatters: it needs tp > 1 and sequence parallelism (Megatron-LM
    refuses --tp-comm-overlap without --sequence-parallel; torchtitan's async TP rewrites the
    all-gather + matmul and matmul + reduce-scatter pairs of its sequence-parallel TP)."""
    if overlap and (tp < 2 or not sequence_parallel):
        return Violation("overlap_tp", "overlapping the tensor-parallel exchanges with the GEMMs "
                         "needs tp > 1 and sequence_parallel (the all-gathers and "
                         "reduce-scatters it chunks)")
    return None


def overlap_method_needs_overlap(method: str, overlap: bool) -> Violation | None:
    """A tensor-parallel overlap method other than the default says how the exchanges overlap
    the GEMMs (plan/plan.py TP_OVERLAP_METHODS); a plan that does not overlap them has none."""
    if method != USERBUFFERS and not overlap:
        return Violation("overlap_tp_method", f"overlap_tp_method {method!r} says how the "
                         f"tensor-parallel exchanges overlap the GEMMs: it needs overlap_tp true")
    return None


def zero3_fetch_needs_zero3(fetch: str, zero_stage: int) -> Violation | None:
    """DeepSpeed's bucketed fetching (zero3_fetch 'buckets') is how its stage 3 gathers
    sharded parameters; stages 0-2 shard none to gather."""
    if fetch != "blocks" and zero_stage != 3:
        return Violation("zero3_fetch", f"zero3_fetch {fetch!r} applies to ZeRO-3 only (zero "
                         f"is {zero_stage}): stages 0-2 gather no sharded parameters")
    return None


def amp_needs_16_bit(amp: str, precision: str, activation_bytes: int | None) -> Violation | None:
    """A mixed-precision mode ('autocast', 'tf-amp': workload/transformer_kinds.py AMP_MODES)
    says which kernels run in float32 beside 16-bit ones; a plan whose activations are 4
    bytes runs every kernel in float32 already ('half', the default, is its only mode)."""
    if amp != "half" and activation_bytes is not None and activation_bytes >= 4:
        return Violation("amp", f"amp {amp!r} applies to 16-bit plans (bf16, fp16, fp8); "
                         f"{precision} runs every kernel on 4-byte values: leave amp out")
    return None


def pipeline_overlap_needs_interleaving(overlap: bool | None, schedule: str,
                                       pp: int) -> Violation | None:
    """The pipeline's sends overlap compute only under the interleaved schedule (Megatron-LM
    turns overlap_p2p_comm off for any other)."""
    if overlap and (schedule != "interleaved" or pp < 2):
        return Violation("overlap_pp", "the pipeline's sends overlap compute only under the "
                         "interleaved schedule with pp >= 2 (Megatron-LM's overlap_p2p_comm)")
    return None


def interleaved_micro_batches(schedule: str, micro_batches: int, pp: int) -> Violation | None:
    """With the interleaved schedule the micro-batches per step m are a multiple of pp
    (Megatron-LM's rule)."""
    if schedule == "interleaved" and micro_batches % pp:
        return Violation("global_batch", f"the interleaved schedule needs the micro-batches per "
                         f"step ({micro_batches}) to be a multiple of pp = {pp} (Megatron-LM's "
                         f"rule)")
    return None


def imbalance_within_experts(imbalance: float, ep: int) -> Violation | None:
    """The busiest ep member gets at most every routed token of the ep group: imbalance ≤ ep
    (with ep = 1 one member holds every expert, so the imbalance is 1)."""
    if imbalance > ep:
        return Violation("expert_imbalance", f"{imbalance:g} is more than ep = {ep}: the "
                         f"busiest of {ep} expert-parallel members gets at most all the tokens")
    return None


def expert_tensor_divides(etp: int | None, tp: int) -> Violation | None:
    """Expert tensor parallelism splits each expert over etp members of the tensor group: etp
    divides tp (None: etp = tp). Megatron-Core also accepts etp above tp, where ep and etp fold
    over the tensor and data ranks together (MoE Parallel Folding); the mesh here carves ep out
    of the data-parallel ranks, so etp ≤ tp."""
    if etp is not None and tp % etp:
        return Violation("etp", f"{etp} does not divide tp = {tp}: each expert is split over "
                         f"etp members of the tensor group")
    return None


def experts_divide(ep: int, shape: TransformerShape) -> Violation | None:
    """ep divides the routed experts (each member holds experts / ep of them); a dense model
    has none to split."""
    if ep > 1 and not shape.experts:
        return Violation("ep", f"{ep} expert-parallel members, but the model has no experts "
                         f"(a dense model takes ep = 1)")
    if shape.experts and shape.experts % ep:
        return Violation("ep", f"{ep} does not divide the model's {shape.experts} experts")
    return None


def context_splits(cp: int, algorithm: str, tp: int, shape: TransformerShape) -> Violation | None:
    """Context parallelism's rules: fused attention (ring attention and Ulysses run on flash
    kernels); ring attention's load-balanced causal split into 2 · cp chunks needs s divisible
    by 2 · cp; the all-to-all (Ulysses) split holds s / cp tokens per member before its
    exchange (cp divides s) and splits the heads over cp inside each tensor shard (cp · tp
    divides the attention heads)."""
    if cp <= 1:
        return None
    if not shape.flash_attention:
        return Violation("cp", "context parallelism runs on fused attention: the workload needs "
                         "flash=true")
    if algorithm == "ring" and shape.seq % (2 * cp):
        return Violation("cp", f"ring attention splits each sequence into 2 × cp chunks: seq "
                         f"{shape.seq} is not a multiple of {2 * cp}")
    if algorithm == "alltoall" and shape.seq % cp:
        return Violation("cp", f"the all-to-all (Ulysses) split gives each member s / cp tokens: "
                         f"seq {shape.seq} is not a multiple of cp {cp}")
    if algorithm == "alltoall" and shape.heads % (cp * tp):
        return Violation("cp", f"the all-to-all (Ulysses) split needs cp × tp = {cp} × {tp} to "
                         f"divide the model's {shape.heads} attention heads")
    return None


def per_op_recompute_shape(recompute: str, shape: TransformerShape) -> Violation | None:
    """Per-operation checkpointing ('op', torchtitan's) is priced for the blocks torchtitan's
    Llama runs: dense, on a fused attention kernel, without a recurrence memory."""
    if recompute != "op":
        return None
    if not shape.flash_attention:
        return Violation("recompute", "op (torchtitan's per-operation checkpointing) keeps the "
                         "fused attention kernel's outputs: the workload needs flash=true")
    if shape.is_moe or shape.memory:
        return Violation("recompute", "op (torchtitan's per-operation checkpointing) is priced "
                         "for dense transformer blocks only: use none, selective or full")
    return None


def precision_on_device(precision: str, system: System) -> Violation | None:
    """An accelerator computes in `precision` only if it has units for it."""
    machine = system.machine
    if machine.is_accelerator and precision not in machine.peak_flops_per_s:
        return Violation("precision", f"{machine.name} has no {precision} units (it has "
                         f"{', '.join(sorted(machine.peak_flops_per_s))})")
    return None


def devices_within_system(tp: int, pp: int, dp: int, system: System, ep: int = 1,
                          cp: int = 1) -> Violation | None:
    """tp · pp · dp · ep · cp devices (the mesh), at most the cluster's."""
    devices = tp * pp * dp * ep * cp
    if devices > system.machines:
        names = "tp·pp·dp" + ("·ep" if ep > 1 else "") + ("·cp" if cp > 1 else "")
        sizes = "·".join(str(v) for v in (tp, pp, dp) + ((ep,) if ep > 1 else ())
                         + ((cp,) if cp > 1 else ()))
        return Violation("", f"needs {devices} devices ({names} = {sizes}) but "
                         f"cluster {system.name!r} has {system.machines}")
    return None


def global_batch_within_epoch(global_batch: int, workload: Workload) -> Violation | None:
    """The global batch B (samples per step, all replicas together) is at most the samples of
    one epoch: a larger B would make an epoch shorter than one step (the epoch time is
    N_samples / X, a step B / X)."""
    if global_batch > workload.samples_per_epoch:
        return Violation("global_batch", f"{global_batch:,} samples per step is more than the "
                         f"{workload.samples_per_epoch:,} samples of one epoch of "
                         f"{workload.name}")
    return None


def parameter_server_on_device(uses_ps: bool, system: System,
                               field: str = "data.aggregation") -> Violation | None:
    """A parameter server is priced on CPU machines only (Project Adam's model: its update
    rate and network); on accelerators the model prices collectives, so a PS plan there is
    refused rather than priced as something it is not."""
    if uses_ps and system.machine.is_accelerator:
        return Violation(field, f"a parameter server is not priced on accelerators "
                         f"({system.machine.name} in {system.name!r}); aggregate by a "
                         f"collective (all-reduce or ZeRO) instead")
    return None


def megatron_aggregation(uses_ps: bool) -> Violation | None:
    """A Megatron-style plan's replicas meet in a collective (all-reduce, ZeRO): the GPU model
    prices no parameter server for them (Project Adam's PS plans are its flags, a Config)."""
    if uses_ps:
        return Violation("data.aggregation", "a Megatron-style plan aggregates by a Collective "
                         "(all-reduce or ZeRO); a parameter server is priced for Project "
                         "Adam's plans only (give those as a Config)")
    return None


def sequence_parallel_splits(sequence_parallel: bool, tp: int) -> bool:
    """Whether sequence parallelism changes anything: it splits norms and dropout over the
    tensor group, so with tp = 1 it is the plan without it (Megatron-LM turns it off there;
    a plan may still say so, and the exporters note it)."""
    return sequence_parallel and tp > 1


def schedule_violation(pp: int, schedule: str, virtual_stages: int,
                       layers: int) -> Violation | None:
    """The rules of a pipeline alone: schedule and virtual stages, pp · v dividing the layers
    (what the search checks once per group). ZeRO-2/3 with a pipeline is a plan like any
    other (priced as torch.distributed.pipelining runs it, model/data_parallel.py); which
    engines run it is plan/engines.py's."""
    return (schedule_virtual_stages(schedule, pp, virtual_stages)
            or pipeline_divides_layers(pp, virtual_stages, layers))


def batch_violation(global_batch: int, dp: int, micro_batch: int, schedule: str,
                    pp: int) -> Violation | None:
    """The rules of the batch: dp · b dividing B, and the interleaved schedule's m % pp."""
    return (batch_divides(global_batch, dp, micro_batch)
            or interleaved_micro_batches(schedule, global_batch // (dp * micro_batch), pp))


def check_plan_shape(plan: ParallelPlan, shape: TransformerShape) -> None:
    """A Megatron-style plan against a transformer's shape: the tensor-parallel degree divides
    the attention and key/value heads, pp · virtual stages divide the layers (also what
    `export` checks, with no system to place the plan on)."""
    require(tensor_divides_heads(plan.tensor.degree, shape))
    require(pipeline_divides_layers(plan.pipeline.stages, plan.pipeline.virtual_stages,
                                    shape.layers))
    require(experts_divide(plan.expert.degree, shape))
    if plan.expert.tensor is not None and not shape.experts:
        require(Violation("etp", "the model has no experts to split (a dense model takes no "
                          "etp)"))
    require(context_splits(plan.context.degree, plan.context.algorithm, plan.tensor.degree,
                           shape))
    require(per_op_recompute_shape(plan.memory.recompute, shape))


def check_modern_plan(plan: ParallelPlan, workload: Workload, system: System) -> None:
    """A Megatron-style plan against the workload and the system: devices, head and layer
    divisibility, a global batch within one epoch, aggregation the model prices on this
    system, the device's precision."""
    require(devices_within_system(plan.tensor.degree, plan.pipeline.stages, plan.data.replicas,
                                  system, plan.expert.degree, plan.context.degree))
    require(global_batch_within_epoch(plan.samples_per_step, workload))
    require(parameter_server_on_device(plan.data.uses_ps, system))
    shape = workload.transformer
    if shape is not None:
        check_plan_shape(plan, shape)
    else:
        require(pipeline_within_layers(plan.pipeline.stages, len(workload.layers)))
        if plan.expert.degree > 1 or plan.context.degree > 1:
            raise InputError("plan.ep" if plan.expert.degree > 1 else "plan.cp",
                             f"{workload.name} is not a transformer: expert and context "
                             f"parallelism split transformer blocks")
    require(precision_on_device(plan.precision.compute, system))


# --- Project Adam's plans ----------------------------------------------------------------------

POOLING_KINDS = ("maxpool2d", "avgpool2d")


def split_limits(workload: Workload, rules: str = "adam") -> list[tuple[Layer, int]]:
    """(weighted layer, the widest split it allows): one unit per member under its widest
    scheme, where a conv split into row stripes also needs a row per member in every pooling
    layer it feeds before the next weighted layer (the stripes run through them;
    runtime/netplan.check_runnable refuses fewer, model/stage.py prices no such path)."""
    layers = workload.layers
    limits = []
    for index, layer in enumerate(layers):
        if not layer.has_weights:
            continue
        if rules != "adam" or "rows" not in split_schemes(layer, rules):
            limits.append((layer, max_split(layer, rules)))
            continue
        rows = split_extent(layer, "rows")
        for following in layers[index + 1:]:
            if following.has_weights or len(following.output_shape) != 3:
                break
            if following.kind in POOLING_KINDS:
                rows = min(rows, split_extent(following, "rows"))
        limits.append((layer, max(split_extent(layer, "channels"), rows)))
    return limits


def max_partitions(workload: Workload, rules: str = "adam") -> int:
    """The largest tensor degree every weighted layer can be split into (split_limits)."""
    limits = [limit for _, limit in split_limits(workload, rules)]
    return min(limits) if limits else 1


def max_replicas(workload: Workload, minibatch: int) -> int:
    """The most replicas whose global step R·n still fits in one epoch: floor(samples / n).

    An epoch shorter than one global step would mean a step that trains on more samples than
    the epoch has, so configurations with R·n > samples_per_epoch are not valid."""
    return workload.samples_per_epoch // minibatch


def minibatch_within_epoch(minibatch: int, workload: Workload) -> Violation | None:
    """One replica's minibatch n is at most the samples of one epoch."""
    if minibatch > workload.samples_per_epoch:
        return Violation("minibatch", f"{minibatch} is more than the "
                         f"{workload.samples_per_epoch} samples of one epoch")
    return None


def layer_splits_into(layer: Layer, scheme: str, partitions: int) -> Violation | None:
    """A weighted layer split by `scheme` gives every one of the P partitions at least one unit
    (output feature, channel or row)."""
    extent = split_extent(layer, scheme)
    if extent >= partitions:
        return None
    if scheme == "rows":
        return Violation("partitions", f"{partitions} stripes do not fit the {extent} output "
                         f"rows of layer {layer.name!r}")
    return Violation("partitions", f"{partitions} is more than layer {layer.name!r} can be split "
                     f"into (at most {extent} units)")


def shards_within_params(ps_shards: int, params: int) -> Violation | None:
    """Every parameter-server shard owns a non-empty slice of the W parameters: S ≤ W (the
    runtime's shard map, runtime/layout.py)."""
    if ps_shards > params:
        return Violation("ps_shards", f"{ps_shards} shards for only {params} parameters")
    return None


def ps_shards_for_sync(sync: str, ps_shards: int) -> Violation | None:
    """All-reduce has no parameter server (S = 0); the PS modes need at least one shard."""
    if sync == "allreduce" and ps_shards != 0:
        return Violation("ps_shards", f"must be 0 with sync allreduce (no parameter server), "
                         f"got {ps_shards}")
    if sync != "allreduce" and ps_shards < 1:
        return Violation("ps_shards", f"must be >= 1 with sync {sync}, got {ps_shards}")
    return None


def protocol_needs_ps(fc_protocol: str, sync: str) -> Violation | None:
    """Adam's vector protocol pushes activation and error vectors for the PS to multiply: it
    needs a parameter server, not all-reduce."""
    if fc_protocol == "vectors" and sync == "allreduce":
        return Violation("fc_protocol", "'vectors' needs a parameter server, not allreduce")
    return None


def check_config(config: AdamFlags, workload: Workload, system: System) -> None:
    """Adam's flags against the workload and the system: a global step within one epoch,
    machines, and P within the narrowest weighted layer's widest split."""
    require(minibatch_within_epoch(config.minibatch, workload), "config")
    require(parameter_server_on_device(config.uses_ps, system, "sync"), "config")
    if config.replicas > max_replicas(workload, config.minibatch):
        raise InputError("config.replicas", f"R·n = {config.replicas}·{config.minibatch} = "
                         f"{config.replicas * config.minibatch} samples per global step is more "
                         f"than one epoch ({workload.samples_per_epoch} samples); at most "
                         f"{max_replicas(workload, config.minibatch)} replicas")
    if system.ps_machines:
        # Dedicated PS hosts: shards go there, and every worker (all-reduce ones too) needs a
        # worker machine of its own (testbed/describe.rank_placements places them so).
        if config.uses_ps and config.ps_shards > system.ps_machines:
            raise InputError("config.ps_shards", f"{config.ps_shards} shards but cluster "
                             f"{system.name!r} has {system.ps_machines} parameter-server machines")
        if config.workers > system.worker_machines:
            raise InputError("config", f"needs {config.workers} worker machines (P·R = "
                             f"{config.partitions}·{config.replicas}) but cluster "
                             f"{system.name!r} has {system.worker_machines}")
    elif config.machines > system.machines:
        raise InputError("config", f"needs {config.machines} machines (P·R + S = "
                         f"{config.partitions}·{config.replicas} + {config.ps_shards}) but cluster "
                         f"{system.name!r} has {system.machines}")
    limits = split_limits(workload)
    if limits:
        narrow, limit = min(limits, key=lambda item: item[1])
        if config.partitions > limit:
            raise InputError("config.partitions", f"{config.partitions} is more than layer "
                             f"{narrow.name!r} can be split into (at most {limit})")


def check_plan(plan: "AdamFlags | ParallelPlan", workload: Workload, system: System) -> None:
    """Adam's flags or a Megatron-style plan against the workload and the system."""
    if isinstance(plan, ParallelPlan):
        check_modern_plan(plan, workload, system)
    else:
        check_config(plan, workload, system)
