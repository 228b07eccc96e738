"""The optimizer's problem: a workload, a system sized to the budget, the search space, the
stage costs per (P, n) priced once, and what fits in memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dnnscale.errors import InputError, require_int
from dnnscale.model.predict import predict_config
from dnnscale.model.prediction import Prediction
from dnnscale.model.stage import StageCosts, stage_costs
from dnnscale.optimize.feasibility import (Infeasible, min_ps_shards, ranges, too_small_error,
                                           worker_fits)
from dnnscale.optimize.space import Group, SearchSpace, make_space
from dnnscale.plan.config import Config, validate_config
from dnnscale.plan.rules import (max_partitions, minibatch_within_epoch,
                                 parameter_server_on_device, require)
from dnnscale.system import System, load_system
from dnnscale.system.load import MAX_MACHINES
from dnnscale.units import format_si
from dnnscale.workload import Workload, load_workload

SCAN_BEYOND = 4096
"""When no P within the budget fits in memory, how many more to try for the error message."""


@dataclass
class Problem:
    """A workload, a cluster sized to the budget, the search space, and what fits in memory."""

    workload: Workload
    cluster: System
    machines: int
    space: SearchSpace
    stages: dict[tuple[int, int], StageCosts]
    """Stage costs per (P, n) under the base's FC protocol, computed once."""
    fitting: dict[tuple[int, int], bool]
    shards_needed: dict[tuple[int, int], int | None]
    """Fewest PS shards that fit in memory per (P, n) (the shards store W + (P−1)·W_rep)."""
    infeasible: list[Infeasible]
    max_partitions: int
    other_stages: dict[tuple[int, int, str], StageCosts] = dataclasses.field(default_factory=dict)
    """Stage costs per (P, n, FC protocol) of the protocols the search chooses among besides
    the base's (Adam's vector protocol moves the FC weight gradients to the PS)."""

    def stage(self, partitions: int, minibatch: int, fc_protocol: str | None = None) -> StageCosts:
        """The stage costs of (P, n) under `fc_protocol` (None: the base's)."""
        if fc_protocol is None or fc_protocol == self.space.base.fc_protocol:
            return self.stages[(partitions, minibatch)]
        return self.other_stages[(partitions, minibatch, fc_protocol)]

    def groups(self) -> list[Group]:
        return [g for g in self.space.groups(self.max_partitions)
                if self.fitting[(g.partitions, g.minibatch)]
                and (not g.uses_ps or self.min_shards(g) is not None)]

    def min_shards(self, group: Group) -> int | None:
        return self.shards_needed.get((group.partitions, group.minibatch))

    def min_machines(self) -> int | None:
        """The smallest budget with a feasible configuration (None: none at any budget)."""
        needs = [g.partitions + ((self.min_shards(g) or 0) if g.uses_ps else 0)
                 for g in self.groups()]
        return min(needs) if needs else None

    def predict(self, config: Config) -> Prediction:
        stage = self.stage(config.partitions, config.minibatch,
                           config.fc_protocol if config.uses_ps else None)
        return predict_config(self.workload, self.cluster, config, stage=stage)


def prepare(workload: str | Path | Workload, cluster: str | Path | System,
            machines: int | None = None, modes: str | Sequence[str] | None = None,
            minibatch: int | Iterable[int] | None = None,
            push_every: int | Iterable[int] | None = None,
            pull_every: int | Iterable[int] | None = None,
            base: Config | None = None, check_budget: bool = True,
            fc_protocols: str | Sequence[str] | None = None,
            choose_overlap: bool = False) -> Problem:
    """Load and validate the inputs; cost each stage once per (P, n) (and per FC protocol the
    search chooses among); find what fits. fc_protocols, choose_overlap: see make_space.

    Raises InputError when the budget admits no feasible configuration (unless check_budget is
    False: the exhaustive reference uses that to confirm there is none).
    """
    w, c = load_workload(workload), load_system(cluster)
    budget = require_int("machines", c.default_budget if machines is None else machines,
                         maximum=MAX_MACHINES)
    if budget != c.machines:
        c = c.with_machines(budget)
    space = make_space(modes, minibatch, push_every, pull_every,
                       None if base is None else validate_config(base, "base"), fc_protocols,
                       choose_overlap)
    infeasible: list[Infeasible] = []
    ps_modes = tuple(mode for mode in space.modes if mode != "allreduce")
    refused = parameter_server_on_device(bool(ps_modes), c, "modes")
    if refused is not None:  # the rules refuse a PS on accelerators: the search leaves it out
        if len(ps_modes) == len(space.modes):
            require(refused, "")
        space = dataclasses.replace(space, modes=("allreduce",))
        infeasible.append(Infeasible(", ".join(ps_modes), refused.message))
    too_large = [n for n in space.minibatches if minibatch_within_epoch(n, w) is not None]
    if too_large:  # a global step may not train on more samples than the epoch has
        if len(too_large) == len(space.minibatches):
            require(minibatch_within_epoch(too_large[0], w), "")
        space = dataclasses.replace(space, minibatches=tuple(
            n for n in space.minibatches if n not in too_large))
        infeasible.append(Infeasible(f"n={ranges(too_large)}", f"more than the "
                                     f"{w.samples_per_epoch} samples of one epoch"))
    p_max = min(max_partitions(w), budget)
    stages: dict[tuple[int, int], StageCosts] = {}
    fitting: dict[tuple[int, int], bool] = {}
    for n in space.minibatches:
        too_big: list[int] = []
        needs: list[float] = []
        for partitions in range(1, p_max + 1):
            stage = stage_costs(w, c, partitions, n, space.base.fc_protocol)
            stages[(partitions, n)] = stage
            fits, need = worker_fits(w, c, space.base, partitions, n, stage)
            fitting[(partitions, n)] = fits
            if not fits:
                too_big.append(partitions)
                needs.append(need)
        if too_big:
            infeasible.append(Infeasible(
                f"P={ranges(too_big)} at n={n}",
                f"a worker needs up to {format_si(max(needs), 'B')} > "
                f"{format_si(c.machine.memory_bytes, 'B')} of memory"))
    min_shards = None
    shards_needed: dict[tuple[int, int], int | None] = {}
    if any(mode != "allreduce" for mode in space.modes):
        by_stored: dict[int, int | None] = {}  # PS memory depends on the stored parameters only
        for key, stage in stages.items():
            stored = stage.stored_params(w.params)
            if stored not in by_stored:
                by_stored[stored] = min_ps_shards(w, c, space.base, stage, max(1, stored))
            shards_needed[key] = by_stored[stored]
        min_shards = shards_needed[(1, space.minibatches[0])]
        if min_shards is None:
            infeasible.append(Infeasible("parameter server", "the weights do not fit in PS memory "
                                         "at any number of shards"))
        elif min_shards > 1:
            infeasible.append(Infeasible(f"S<{min_shards}", "the parameter-server shards do not "
                                         "fit in PS memory"))
    # Worker memory does not depend on the FC protocol (the same splits, weights, activations):
    # the other protocols' stages are only priced.
    other = {(p, n, protocol): stage_costs(w, c, p, n, protocol) for (p, n) in stages
             for protocol in space.protocols() if protocol != space.base.fc_protocol}
    problem = Problem(w, c, budget, space, stages, fitting, shards_needed, infeasible, p_max,
                      other)
    needed = problem.min_machines()
    if check_budget and (needed is None or needed > budget):
        fitting_p = [p for (p, _), fits in fitting.items() if fits]
        n_min = space.minibatches[0]
        _, need = worker_fits(w, c, space.base, p_max, n_min, stages[(p_max, n_min)])
        widest = (p_max, n_min, need)
        if not fitting_p:  # beyond the budget, how many partitions would fit?
            for partitions in range(p_max + 1, min(max_partitions(w), p_max + SCAN_BEYOND) + 1):
                stage = stage_costs(w, c, partitions, n_min, space.base.fc_protocol)
                fits, need = worker_fits(w, c, space.base, partitions, n_min, stage)
                widest = (partitions, n_min, need)
                if fits:
                    fitting_p = [partitions]
                    break
        if fitting_p and (min(fitting_p), n_min) in shards_needed:
            min_shards = shards_needed[(min(fitting_p), n_min)]
        raise too_small_error(budget, min(fitting_p) if fitting_p else None, min_shards,
                              space.modes, w, c, widest)
    return problem
