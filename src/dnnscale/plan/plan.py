"""The typed parallel plan: how training is split, one record for every kind of system.

Project Adam and Megatron-style training are one plan at different settings (design README,
"One core for every plan"): Adam's vertical partitioning across P machines is a tensor split
with Adam's split rules; its R replicas are data parallelism whose gradients a sharded parameter
server aggregates instead of a collective; its push interval is gradient accumulation on the PS
side. `Config` (plan/config.py) keeps Adam's flags and builds one of these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from dnnscale.plan.mesh import DeviceMesh, MeshDim

SPLIT_RULES = ("adam", "megatron")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
RECOMPUTE = ("none", "selective", "full", "op")
OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}
"""Optimizer -> values of state it keeps per parameter (momentum buffer; Adam's m and v)."""
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
FC_PROTOCOLS = ("weights", "vectors")
ALGORITHMS = ("ring", "tree", "hierarchical")
CP_ALGORITHMS = ("ring", "alltoall")
"""Context parallelism's attention: 'ring' (ring attention: K/V blocks passed around the cp
group while each member computes on the block it holds; Liu et al. 2023, Megatron-Core's
context parallelism) or 'alltoall' (DeepSpeed-Ulysses: all-to-alls swap the sequence split for
a head split around the attention core; Jacobs et al. 2023)."""
ZERO3_FETCH = ("blocks", "buckets")
"""How ZeRO-3 gathers and reduces its sharded parameters: 'blocks', one all-gather and one
reduce-scatter per transformer block (PyTorch FSDP/FSDP2 wrapped per block, as llm-foundry and
torchtitan wrap it); 'buckets', DeepSpeed's stage 3: all-gathers of the parameters in prefetch
buckets, gradients reduce-scattered in reduce buckets (model/zero3_fetch.py)."""
USERBUFFERS, MICRO_PIPELINE = "userbuffers", "micro_pipeline"
TP_OVERLAP_METHODS = (USERBUFFERS, MICRO_PIPELINE)
"""How an overlapping plan (TensorSplit.overlap) runs its sequence-parallel exchanges under the
GEMMs: 'userbuffers', Transformer Engine's (Megatron-LM's --tp-comm-overlap): every all-gather
and reduce-scatter of the block's linear layers, forward and backward; 'micro_pipeline',
torch's async tensor parallelism (torchtitan's enable_async_tensor_parallel: the inductor pass
torch/_inductor/fx_passes/micro_pipeline_tp.py), which fuses an all-gather with the matmuls
that read its result and a reduce-scatter with the one matmul that produces its input, so a
backward reduce-scatter of a gradient summed over several Linear modules (torchtitan's
separate wq, wk, wv and SwiGLU's w1, w3) runs after the sum, exposed (model/stage.py)."""
GRAD_ACCUMULATION = ("fused", "add", "clip_add")
"""How each micro-batch's weight gradients join the step's (model/accumulation.py prices each):
'fused', Megatron-LM's gradient-accumulation fusion (its default): the GEMM layers' weight
gradients accumulate inside the weight-gradient GEMM, and a hook adds the other parameters'
(norms, embeddings) into the fp32 main gradients every micro-batch; 'add', autograd's
accumulation (PyTorch DDP, FSDP, DeepSpeed, torchtitan; Megatron with
--no-gradient-accumulation-fusion): every micro-batch after the first adds each gradient into
the one held; 'clip_add', DeepLearningExamples' TensorFlow 1 BERT optimizer (optimization.py):
each micro-batch's gradients are norm-clipped (checked for overflow under fp16 loss scaling)
and added into fp32 accumulators."""


@dataclass(frozen=True)
class TensorSplit:
    """Intra-layer split over `degree` devices. rules: 'adam' (Project Adam's vertical split:
    FC layers by output features, convolutions by channels or horizontal stripes, the cheaper per
    layer) or 'megatron' (column/row pairs; sequence_parallel splits norms and dropout too).
    overlap: the sequence-parallel all-gathers and reduce-scatters run in tp chunks under the
    GEMMs beside them (Megatron's --tp-comm-overlap, Transformer Engine's userbuffers;
    torchtitan's async tensor parallelism); it needs sequence parallelism. overlap_method:
    which of the two runs it (TP_OVERLAP_METHODS)."""

    degree: int = 1
    rules: str = "adam"
    sequence_parallel: bool = False
    overlap: bool = False
    overlap_method: str = USERBUFFERS

    @property
    def overlap_mode(self) -> str | None:
        """How the exchanges overlap the GEMMs: `overlap_method` when the split overlaps them,
        else None."""
        return self.overlap_method if self.overlap else None


@dataclass(frozen=True)
class Pipeline:
    """`stages` pipeline stages run with `schedule`; `virtual_stages` chunks per device for the
    interleaved schedule (1 otherwise). overlap_p2p: a stage's sends and receives travel while
    it computes the next chunk (Megatron's overlap_p2p_comm, on by default with the
    interleaved schedule and only there); None: the engine's default. scatter_gather: each of
    a tensor group's t members sends 1/t of the boundary tensor and the receivers all-gather it
    over the tensor group (Megatron-LM's scatter_gather_tensors_in_pipeline before
    Megatron-Core; DeepSpeed's pipeline.pipe_partitioned and grad_partitioned, on by default);
    False: each member sends the whole tensor it holds (Megatron-Core), which under sequence
    parallelism is s/t of the sequence already (DeepSpeed partitions that again). It changes
    nothing at tp = 1."""

    stages: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    overlap_p2p: bool | None = None
    scatter_gather: bool = False

    @property
    def overlaps_p2p(self) -> bool:
        """Whether the sends overlap compute: `overlap_p2p`, or by default with the interleaved
        schedule on more than one stage (Megatron-LM: --no-overlap-p2p-communication turns it
        off; a non-interleaved schedule forces it off)."""
        if self.overlap_p2p is not None:
            return self.overlap_p2p
        return self.schedule == "interleaved" and self.stages > 1


@dataclass(frozen=True)
class ParameterServer:
    """Gradients aggregated by `shards` parameter-server machines.

    asynchronous: replicas never wait for each other (Project Adam) or they do (synchronous SGD).
    push_every / pull_every: steps between a worker's pushes of accumulated updates / pulls of
    fresh weights. fc_protocol: 'weights' (push weight gradients) or 'vectors' (Adam's protocol:
    push FC activation and error vectors; the PS computes the outer products).
    """

    shards: int = 1
    asynchronous: bool = True
    push_every: int = 1
    pull_every: int = 1
    fc_protocol: str = "weights"


@dataclass(frozen=True)
class Collective:
    """Gradients aggregated by a collective among the replicas (no parameter server).

    algorithm: how the data-parallel collectives run, 'ring' (rings on each tier, two-level
    across nodes: what was always priced), 'hierarchical' (the same) or 'tree' (NCCL's double
    binary tree all-reduce; model/collectives.py). zero_stage: 0 (plain all-reduce), 1, 2 or 3
    (ZeRO / FSDP: optimizer state, gradients, parameters sharded over the replicas). overlap:
    the gradients travel in buckets while the backward pass still computes (PyTorch DDP,
    Megatron's --overlap-grad-reduce), else after it. fetch: ZeRO-3's granularity
    (ZERO3_FETCH).
    """

    algorithm: str = "ring"
    zero_stage: int = 0
    overlap: bool = False
    fetch: str = "blocks"
    """ZeRO-3's gather granularity (ZERO3_FETCH): 'blocks' (FSDP) or 'buckets' (DeepSpeed)."""


@dataclass(frozen=True)
class DataParallel:
    """`replicas` copies of the model on different data, and how their gradients meet."""

    replicas: int = 1
    aggregation: ParameterServer | Collective = field(default_factory=ParameterServer)

    @property
    def uses_ps(self) -> bool:
        return isinstance(self.aggregation, ParameterServer)


@dataclass(frozen=True)
class Batch:
    """Samples per micro-batch, and micro-batches each replica runs per step (gradient
    accumulation; the pipeline's m). A replica's step takes micro_batch · accumulation samples."""

    micro_batch: int = 32
    accumulation: int = 1
    grad_accumulation: str = "fused"
    """How the micro-batches' gradients accumulate on an accelerator (GRAD_ACCUMULATION)."""

    @property
    def per_replica(self) -> int:
        return self.micro_batch * self.accumulation


@dataclass(frozen=True)
class MemoryPolicy:
    """Activation recomputation: 'none', 'selective' (the attention core, as Megatron-Core
    checkpoints it), 'full' (every block's forward) or 'op' (torchtitan's per-operation
    selective checkpointing: the matmuls' and the attention kernel's outputs kept, except
    every second matmul's, every other operation of the block run again); and how the loss is
    computed (workload/transformer_kinds.py LOSS_KERNELS)."""

    recompute: str = "none"
    loss: str = "inplace"
    """How the loss is computed (workload/transformer_kinds.py LOSS_KERNELS): its traffic and
    the memory it holds at its peak."""


@dataclass(frozen=True)
class Precision:
    """Number formats. `compute`: the precision the math runs in. Bytes per value of parameters,
    gradients, each optimizer-state value and activations; None takes the workload's own width.
    master_weights: mixed precision keeps an fp32 copy of the weights with the optimizer state."""

    compute: str = "fp32"
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    activation_bytes: int | None = None
    master_weights: bool = False
    amp: str = "half"
    """How a 16-bit plan's memory-bound kernels run (workload/transformer_kinds.py AMP_MODES):
    'half' (the model cast to 16 bits), 'autocast' (torch.autocast over float32 weights) or
    'tf-amp' (TensorFlow's mixed-precision graph rewrite); plans with 4-byte activations take
    'half' only."""


@dataclass(frozen=True)
class ExpertParallel:
    """Mixture-of-experts layers' experts split over `degree` devices (the mesh's ep): each
    holds experts / ep of them and the tokens routed to them arrive by all-to-all.

    imbalance: the busiest ep member's routed tokens over the mean (1.0: uniform routing, the
    default; a real router's is measured, not modelled). It slows that member's expert GEMMs
    and its all-to-all, capped by the workload's capacity factor where tokens are dropped."""

    degree: int = 1
    imbalance: float = 1.0
    tensor: int | None = None
    """Expert tensor parallelism (etp): the routed experts' tensor split, None for the plan's
    tp (Megatron-Core's default); a divisor of tp below it leaves each expert whole on etp
    members and spreads the tensor group's tokens over more experts (Megatron's
    --expert-tensor-parallel-size, torchtitan's expert_tensor_parallel_degree 1)."""


@dataclass(frozen=True)
class ContextParallel:
    """The sequence split over `degree` devices (the mesh's cp): every member holds s / cp
    tokens of each sample; attention runs by `algorithm` (CP_ALGORITHMS)."""

    degree: int = 1
    algorithm: str = "ring"


@dataclass(frozen=True)
class ParallelPlan:
    """The whole plan: tensor × pipeline × data parallelism, batch, memory policy, precision.

    optimizer: the training optimizer (its state per parameter, OPTIMIZERS). overlap: Adam's
    overlap of parameter-server transfers with computation, combined with the system's γ-norm.
    epoch_fraction: Adam's straggler cut-off f (an epoch ends when f of the samples are done).
    """

    tensor: TensorSplit = field(default_factory=TensorSplit)
    pipeline: Pipeline = field(default_factory=Pipeline)
    data: DataParallel = field(default_factory=DataParallel)
    batch: Batch = field(default_factory=Batch)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    precision: Precision = field(default_factory=Precision)
    optimizer: str = "sgd"
    overlap: bool = False
    epoch_fraction: float = 1.0
    expert: ExpertParallel = field(default_factory=ExpertParallel)
    context: ContextParallel = field(default_factory=ContextParallel)

    @cached_property
    def mesh(self) -> DeviceMesh:
        """The plan's device mesh (plan/mesh.py): tp = the tensor split's degree (Adam's P,
        split by Adam's rules), pp = the pipeline's stages, dp = the replicas (Adam's R),
        ep = the expert split, cp = the sequence split. Raises InputError naming
        `mesh.<dim>` for a size below 1."""
        return DeviceMesh.of(tp=self.tensor.degree, pp=self.pipeline.stages,
                             dp=self.data.replicas, ep=self.expert.degree,
                             cp=self.context.degree)

    @property
    def batch_replicas(self) -> int:
        """Members that take different samples: dp · ep (the ep members of a dense layer are
        data parallel; the cp members share their samples' sequences)."""
        return self.data.replicas * self.expert.degree

    @property
    def dense_replicas(self) -> int:
        """Members holding the same dense (non-expert) parameter shard, whose gradients meet:
        dp · ep · cp (Megatron-Core's data-parallel group with context parallelism)."""
        return self.dense_group(self.data.replicas)

    def dense_group(self, replicas: int) -> int:
        """`dense_replicas` at `replicas` along dp: replicas · ep · cp."""
        return replicas * self.expert.degree * self.context.degree

    @property
    def expert_tensor(self) -> int:
        """etp: the routed experts' tensor split (ExpertParallel.tensor, else tp)."""
        return self.expert.tensor or self.tensor.degree

    @property
    def expert_replicas(self) -> int:
        """Members holding the same experts, whose expert gradients meet: dp · cp · tp / etp
        (Megatron-Core's expert data-parallel group; dp · cp when etp = tp)."""
        return self.expert_group(self.data.replicas)

    def expert_group(self, replicas: int) -> int:
        """`expert_replicas` at `replicas` along dp: replicas · cp · tp / etp."""
        return replicas * self.context.degree * (self.tensor.degree // self.expert_tensor)

    @property
    def devices_per_replica(self) -> int:
        """Devices of one data-parallel replica: the mesh's devices over its dp size."""
        mesh = self.mesh
        return mesh.devices // mesh.size(MeshDim.DP)

    @property
    def workers(self) -> int:
        """Devices that hold a piece of a model replica: the whole mesh."""
        return self.mesh.devices

    @property
    def ps_shards(self) -> int:
        aggregation = self.data.aggregation
        return aggregation.shards if isinstance(aggregation, ParameterServer) else 0

    @property
    def machines(self) -> int:
        """Machines the plan occupies: its workers plus its parameter-server shards."""
        return self.workers + self.ps_shards

    @property
    def samples_per_step(self) -> int:
        """Samples all replicas together process per step (the global batch): dp · ep
        members each run micro_batch · accumulation samples."""
        return self.batch.per_replica * self.batch_replicas

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        aggregation = self.data.aggregation
        data["data"]["aggregation"] = {"kind": type(aggregation).__name__, **asdict(aggregation)}
        return data
