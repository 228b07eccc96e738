"""What the optimizer may choose: sync modes, minibatches, push/pull intervals, the fixed rest.

The decision variables are P (partitions per replica), R (replicas), S (parameter-server shards,
or all-reduce instead) and, only where the user lists several values, the minibatch n and the
push/pull intervals k_push/k_pull. A *group* fixes everything but R and S: (sync mode, P, n,
k_push, k_pull); within a group the search chooses R and S under R·P + S ≤ M.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from dnnscale.plan.config import SYNC_MODES, Config
from dnnscale.plan.rules import protocol_needs_ps
from dnnscale.errors import InputError, require_int, short_repr

DEFAULT_MINIBATCH = 32
"""n when the user does not let it vary: the Config default (Project Adam's workers ran small
minibatches). The model does not price statistical efficiency, so a larger n always looks faster;
the optimizer varies n only when asked (--minibatch 16,32,64)."""

MAX_CHOICES = 64
"""The most values a varied field (minibatch, push/pull interval) may list: the search space
grows with their product."""

CURVE_DENSE_UP_TO = 256
"""The scalability curve has every budget 1..CURVE_DENSE_UP_TO, then log-spaced budgets."""
CURVE_POINTS_PER_DECADE = 48


@dataclass(frozen=True)
class Group:
    """Everything of a configuration but R and S: one sync mode, P, n, k_push, k_pull, and
    (issue 18, set only where the user lets the optimizer choose them; None keeps the base's)
    Adam's FC protocol and overlap."""

    sync: str
    partitions: int
    minibatch: int
    push_every: int
    pull_every: int
    fc_protocol: str | None = None
    overlap: bool | None = None

    @property
    def uses_ps(self) -> bool:
        return self.sync != "allreduce"

    def config(self, base: Config, replicas: int, ps_shards: int) -> Config:
        """The full configuration of this group with R replicas and S shards (0 for all-reduce)."""
        adam = {key: value for key, value in (("fc_protocol", self.fc_protocol),
                                              ("overlap", self.overlap)) if value is not None}
        return replace(base, sync=self.sync, partitions=self.partitions, replicas=replicas,
                       ps_shards=ps_shards if self.uses_ps else 0, minibatch=self.minibatch,
                       push_every=self.push_every, pull_every=self.pull_every, **adam)

    def label(self) -> str:
        return (f"{self.sync} P={self.partitions} n={self.minibatch}"
                + (f" k_push={self.push_every} k_pull={self.pull_every}" if self.uses_ps else "")
                + (f" fc={self.fc_protocol}" if self.fc_protocol is not None else "")
                + (f" overlap={'on' if self.overlap else 'off'}" if self.overlap is not None
                   else ""))


@dataclass(frozen=True)
class SearchSpace:
    """The choices open to the optimizer; `base` holds the fixed fields (fc_protocol, overlap,
    optimizer, epoch_fraction)."""

    modes: tuple[str, ...]
    minibatches: tuple[int, ...]
    push_every: tuple[int, ...]
    pull_every: tuple[int, ...]
    base: Config
    fc_protocols: tuple[str, ...] = ()
    """Adam's FC protocols to choose from (PS modes); () keeps the base's."""
    overlaps: tuple[bool, ...] = ()
    """Overlap off/on to choose from (PS modes); () keeps the base's."""

    def groups(self, max_partitions: int) -> list[Group]:
        """Every group with P in 1..max_partitions (intervals, and the FC protocol and overlap
        when they are chosen, only matter with a PS)."""
        result = []
        for sync in self.modes:
            ps = sync != "allreduce"
            pushes = self.push_every if ps else (1,)
            pulls = self.pull_every if ps else (1,)
            protocols: tuple[str | None, ...] = self.fc_protocols if ps and self.fc_protocols \
                else (None,)
            overlaps: tuple[bool | None, ...] = self.overlaps if ps and self.overlaps else (None,)
            for n in self.minibatches:
                for k_push in pushes:
                    for k_pull in pulls:
                        for protocol in protocols:
                            for overlap in overlaps:
                                for partitions in range(1, max_partitions + 1):
                                    result.append(Group(sync, partitions, n, k_push, k_pull,
                                                        protocol, overlap))
        return result

    def protocols(self) -> tuple[str, ...]:
        """Every FC protocol some group uses."""
        return self.fc_protocols or (self.base.fc_protocol,)


def _int_choices(values: int | Iterable[int] | None, default: int, field: str,
                 minimum: int = 1) -> tuple[int, ...]:
    if values is None:
        return (default,)
    items = [values] if isinstance(values, int) else list(values)
    if not items:
        raise InputError(field, "must list at least one value")
    if len(items) > MAX_CHOICES:
        raise InputError(field, f"lists {len(items)} values; the limit is {MAX_CHOICES}")
    for item in items:
        require_int(field, item, minimum=minimum)
    return tuple(sorted(set(items)))


def parse_int_list(text: str | None, field: str, minimum: int = 1) -> tuple[int, ...] | None:
    """'16,32,64' -> (16, 32, 64); None stays None. Each value at least `minimum` (0 for
    ZeRO stages). Errors name `field`."""
    if text is None:
        return None
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    if not parts:
        raise InputError(field, f"must be a comma-separated list of integers, got {text!r}")
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise InputError(field, f"must be a comma-separated list of integers, got {text!r}") from None
    return _int_choices(values, DEFAULT_MINIBATCH, field, minimum)


def _named_choices(text: str | Sequence[str], known: Sequence[str], field: str,
                   what: str) -> tuple[str, ...]:
    """'a,b' (or a sequence) -> the named choices among `known`, in `known`'s order."""
    if not isinstance(text, (str, list, tuple)):
        raise InputError(field, f"must be names, comma-separated or a list, got "
                         f"{short_repr(text)}")
    items = [m.strip() for m in text.split(",")] if isinstance(text, str) else [str(m) for m in text]
    items = [m for m in items if m]
    if not items:
        raise InputError(field, f"must list at least one of {', '.join(known)}")
    for item in items:
        if item not in known:
            raise InputError(field, f"unknown {what} {item!r} (known: {', '.join(known)})")
    return tuple(m for m in known if m in items)


def parse_modes(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """'ps-async,allreduce' (or a sequence) -> validated tuple; None stays None."""
    return None if text is None else _named_choices(text, SYNC_MODES, "modes", "sync mode")


def parse_fc_protocols(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """'weights,vectors' (or a sequence) -> the FC protocols to choose from; () for None."""
    from dnnscale.plan.plan import FC_PROTOCOLS

    return () if text is None else _named_choices(text, FC_PROTOCOLS, "fc_protocol",
                                                  "FC protocol")


def make_space(modes: str | Sequence[str] | None = None,
               minibatch: int | Iterable[int] | None = None,
               push_every: int | Iterable[int] | None = None,
               pull_every: int | Iterable[int] | None = None,
               base: Config | None = None,
               fc_protocols: str | Sequence[str] | None = None,
               choose_overlap: bool = False) -> SearchSpace:
    """Validate the user's choices into a SearchSpace (InputError names the field).

    modes None: every mode the fixed fields allow (all-reduce is left out with Adam's 'vectors'
    FC protocol, which needs a parameter server). fc_protocols: several FC protocols for the
    PS modes to choose from (one value fixes it, as base.fc_protocol does); choose_overlap:
    the PS modes may run with overlap on or off.
    """
    base = base or Config()
    protocols = parse_fc_protocols(fc_protocols)
    if len(protocols) == 1:
        base = replace(base, fc_protocol=protocols[0])
        protocols = ()
    chosen = parse_modes(modes)
    if chosen is None:
        chosen = tuple(m for m in SYNC_MODES if protocol_needs_ps(base.fc_protocol, m) is None)
    elif any(protocol_needs_ps(base.fc_protocol, m) is not None for m in chosen):
        raise InputError("modes", "allreduce cannot be used with fc_protocol 'vectors' (it needs a "
                         "parameter server)")
    if not isinstance(base.epoch_fraction, (int, float)) or not 0 < base.epoch_fraction <= 1:
        raise InputError("epoch_fraction", f"must be in (0, 1], got {base.epoch_fraction!r}")
    if protocols and base.fc_protocol == "vectors":
        base = replace(base, fc_protocol="weights")  # all-reduce groups keep the weights
    return SearchSpace(modes=chosen,
                       minibatches=_int_choices(minibatch, DEFAULT_MINIBATCH, "minibatch"),
                       push_every=_int_choices(push_every, base.push_every, "push_every"),
                       pull_every=_int_choices(pull_every, base.pull_every, "pull_every"),
                       base=base, fc_protocols=protocols,
                       overlaps=(False, True) if choose_overlap else ())


def curve_budgets(first: int, last: int) -> list[int]:
    """Budgets of the scalability curve: every integer first..min(last, 256); above that,
    CURVE_POINTS_PER_DECADE log-spaced budgets per decade plus the round ones (1-2-5 series,
    powers of two); always ending at `last`."""
    if last < first:
        return []
    budgets = set(range(first, min(last, CURVE_DENSE_UP_TO) + 1))
    if last > CURVE_DENSE_UP_TO:
        start = max(first, CURVE_DENSE_UP_TO)
        steps = math.ceil(math.log10(last / start) * CURVE_POINTS_PER_DECADE)
        budgets.update(round(start * 10 ** (step / CURVE_POINTS_PER_DECADE))
                       for step in range(1, steps + 1))
        scale = 1
        while scale <= last:
            budgets.update({scale, 2 * scale, 5 * scale})
            scale *= 10
        power = 1
        while power <= last:
            budgets.add(power)
            power *= 2
    budgets.add(last)
    return sorted(b for b in budgets if first <= b <= last)
