"""Write the corpus plans (issue 22): which configurations each testbed setting runs, and the
split of every row, committed before anything is measured.

    .venv/bin/python benchmarks/corpus_design.py            # writes benchmarks/corpus/<setting>.yaml

For each setting and workload (adam-cifar10, adam-imagenet22k-small, adam-mnist):
- three calibration rows (fit only the baselines): P=1 R=1 S=1 ps-sync, P=1 R=2 all-reduce and
  P=2 R=1 S=1 ps-async, the rows the earlier grids used;
- evaluated rows drawn with a fixed seed from every configuration the validity rules accept on
  the setting's hosts (P <= 4, S <= 3, minibatch 8, 16 or 32), round-robin over the
  synchronisation kinds so that PS-sync, PS-async and all-reduce all appear; 60 % of them test,
  40 % dev, drawn per workload;
- Adam's mechanisms as pairs that differ in one thing (weights vs vectors, overlap off vs on,
  epoch cut-off 1 vs 0.75), each pair kept in one split; the vectors pair is the configuration
  where the model (the setting as asked, uncalibrated) predicts the largest vectors speed-up.
The optimizer's own choice is added when the setting is measured (its row id starts `opt-`).
The split never changes after measuring starts: rows are only reported, never re-drawn.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.corpus import (WORKLOADS, Plan, Row, Setting, load_settings,  # noqa: E402
                                      workload_path)
EVALUATED_PER_WORKLOAD = 9
TEST_SHARE = 0.6
SEED = 22
CALIBRATION = ({"partitions": 1, "replicas": 1, "ps_shards": 1, "sync": "ps-sync"},
               {"partitions": 1, "replicas": 2, "sync": "allreduce"},
               {"partitions": 2, "replicas": 1, "ps_shards": 1, "sync": "ps-async"})


def synthetic_description(setting: Setting) -> dict:  # type: ignore[type-arg]
    """The setting's testbed description as `testbed up` would write it (links and shares as
    asked, nothing measured), without building it."""
    from dnnscale.testbed.spec import make_spec

    spec = make_spec(setting.testbed, setting.hosts, setting.rate, cpu=setting.cpu,
                     ps_hosts=setting.ps_hosts, ps_rate=setting.ps_rate or None)
    names = spec.names
    hosts = [{"name": h.name, "role": h.role, "namespace": names.namespace(h.name),
              "address": f"198.18.200.{i + 1}", "ifname": "eth0", "veth": names.veth(h.name),
              "cgroup": f"/sys/fs/cgroup/cpu/{names.cgroup(h.name).name}",
              "rate_bytes_per_s": h.rate_bytes_per_s, "latency_s": h.latency_s,
              "cpu_cores": h.cpu_cores, "cpu_period_s": h.cpu_period_s}
             for i, h in enumerate(spec.hosts)]
    return {"testbed": setting.testbed, "subnet": "198.18.200.0/24", "bridge": names.bridge,
            "created": "design", "hosts": hosts}


def synthetic_cluster(setting: Setting):  # type: ignore[no-untyped-def]
    """The setting's System as `testbed up` would describe it (links and shares as asked)."""
    from dnnscale.testbed.describe import cluster_from_description, description_from_dict

    return cluster_from_description(description_from_dict(synthetic_description(setting)))


def valid(workload, cluster, fields: dict):  # type: ignore[no-untyped-def]
    from dnnscale.errors import InputError
    from dnnscale.plan import check_config, config_from_dict

    try:
        config = config_from_dict(dict(fields))
        check_config(config, workload, cluster)
    except InputError:
        return None
    return config


def candidates(workload, cluster, hosts: int):  # type: ignore[no-untyped-def]
    """Every configuration the rules accept, with plain Adam flags (weights, no overlap)."""
    out = []
    for p, r, n in itertools.product((1, 2, 3, 4), range(1, hosts + 1), (8, 16, 32)):
        for sync in ("ps-sync", "ps-async", "allreduce"):
            shard_counts = (1, 2, 3) if sync != "allreduce" else (None,)
            for s in shard_counts:
                if sync == "allreduce" and p * r < 2:
                    continue
                fields = {"partitions": p, "replicas": r, "sync": sync, "minibatch": n}
                if s is not None:
                    fields["ps_shards"] = s
                config = valid(workload, cluster, fields)
                if config is not None:
                    out.append(config)
    return out


def draw(configs: list, count: int, rng: random.Random) -> list:
    """`count` configurations, round-robin over the synchronisation kinds."""
    by_sync: dict[str, list] = {}
    for config in configs:
        by_sync.setdefault(config.sync, []).append(config)
    for group in by_sync.values():
        rng.shuffle(group)
    picked: list = []
    while len(picked) < count and any(by_sync.values()):
        for sync in sorted(by_sync):
            if by_sync[sync] and len(picked) < count:
                picked.append(by_sync[sync].pop())
    return picked


def vectors_pair(workloads: dict, cluster, hosts: int):  # type: ignore[no-untyped-def]
    """(short name, weights config, vectors config, predicted speed-up) with the largest
    predicted vectors speed-up over every workload's PS configurations."""
    import dataclasses

    from dnnscale.model import predict_config

    best = None
    for short, workload in workloads.items():
        for config in candidates(workload, cluster, hosts):
            if config.sync == "allreduce":
                continue
            vectors = valid(workload, cluster, {**config.to_dict(), "fc_protocol": "vectors"})
            if vectors is None:
                continue
            plain = dataclasses.replace(config, fc_protocol="weights")
            speedup = (predict_config(workload, cluster, vectors).throughput_samples_per_s
                       / predict_config(workload, cluster, plain).throughput_samples_per_s)
            if best is None or speedup > best[3]:
                best = (short, plain, vectors, speedup)
    return best


def mechanism_pairs(workloads: dict, cluster, hosts: int, rng: random.Random) -> list:
    """[(group, short, config a, config b)]: vectors, overlap and cut-off pairs."""
    pairs = []
    found = vectors_pair(workloads, cluster, hosts)
    if found is not None:
        short, plain, vectors, speedup = found
        pairs.append((f"vectors x{speedup:.2f} predicted", short, plain, vectors))
    for group, change in (("overlap", {"overlap": True}), ("cut-off", {"epoch_fraction": 0.75})):
        short = rng.choice(sorted(workloads))
        options = [c for c in candidates(workloads[short], cluster, hosts)
                   if c.sync != "allreduce" and c.replicas >= 2]
        rng.shuffle(options)
        for config in options:
            other = valid(workloads[short], cluster, {**config.to_dict(), **change})
            if other is not None:
                pairs.append((group, short, config, other))
                break
    return pairs


def design(setting: Setting) -> Plan:
    from dnnscale.workload import load_workload

    rng = random.Random(f"{SEED}-{setting.name}")
    cluster = synthetic_cluster(setting)
    hosts = setting.hosts + setting.ps_hosts
    workloads = {short: load_workload(workload_path(ref, ROOT))
                 for short, ref in WORKLOADS.items()}
    rows: list[Row] = []
    taken: set = set()
    for short, workload in workloads.items():
        for index, fields in enumerate(CALIBRATION):
            config = valid(workload, cluster, {**fields, "minibatch": 16})
            if config is not None:
                rows.append(Row(f"{short}-k{index + 1}", WORKLOADS[short], "calibration", config))
                taken.add((short, config))
        pool = [c for c in candidates(workload, cluster, hosts) if (short, c) not in taken]
        picked = draw(pool, EVALUATED_PER_WORKLOAD, rng)
        tests = set(rng.sample(range(len(picked)), round(TEST_SHARE * len(picked))))
        for index, config in enumerate(picked):
            rows.append(Row(f"{short}-c{index + 1:02d}", WORKLOADS[short],
                            "test" if index in tests else "dev", config))
            taken.add((short, config))
    for number, (group, short, a, b) in enumerate(
            mechanism_pairs(workloads, cluster, hosts, rng)):
        split = "test" if number % 2 == 0 else "dev"
        for suffix, config in (("a", a), ("b", b)):
            if (short, config) in taken:
                continue
            rows.append(Row(f"{short}-m{number + 1}{suffix}", WORKLOADS[short], split, config,
                            group=f"m{number + 1} {group}"))
            taken.add((short, config))
    return Plan(setting=setting.name, rows=tuple(rows),
                notes=(setting.description,
                       f"designed by benchmarks/corpus_design.py (seed {SEED}) before measuring"))


def main() -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", type=Path, default=ROOT / "benchmarks/corpus/settings.yaml")
    parser.add_argument("--only", help="one setting")
    args = parser.parse_args()
    for name, setting in load_settings(args.settings).items():
        if args.only and name != args.only:
            continue
        plan = design(setting)
        path = args.settings.parent / f"{name}.yaml"
        path.write_text(f"# Corpus plan of setting {name} (benchmarks/corpus_design.py); "
                        "committed before measuring.\n"
                        + yaml.safe_dump(plan.to_dict(), sort_keys=False, width=100))
        splits = {s: sum(r.split == s for r in plan.rows) for s in ("calibration", "dev", "test")}
        print(f"{name}: {len(plan.rows)} rows {splits} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
