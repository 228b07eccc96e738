"""Generate the committed snapshot of `predict` outputs that guards the model core.

Written before the one-core refactor (issue 12) and run once then; the test
tests/test_predict_snapshot.py re-predicts every case and compares with 1e-9 relative
tolerance. Re-run only for a deliberate change of the model, and say so in the commit.

    .venv/bin/python tests/snapshots/make_predict_snapshot.py
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

HERE = Path(__file__).parent
CLUSTERS = ("adam-2014", "local", str(HERE / "clusters" / "calibrated-100mbit.yaml"),
            str(HERE / "clusters" / "ps-hosts.yaml"))
WORKLOADS = ("adam-mnist", "adam-cifar10", "adam-imagenet22k", "alexnet", "vgg16",
             "mlp:784-1024-1024-10")


def cases() -> list[dict[str, object]]:
    """Configurations per (workload, cluster): modes x P x R x S x n, plus variants."""
    grid: list[dict[str, object]] = []
    for sync, partitions, replicas, minibatch in itertools.product(
            ("ps-async", "ps-sync", "allreduce"), (1, 2, 3), (1, 4), (8, 32)):
        cfg = {"sync": sync, "partitions": partitions, "replicas": replicas,
               "minibatch": minibatch, "ps_shards": 0 if sync == "allreduce" else
               (1 if replicas == 1 else 3)}
        grid.append(cfg)
    variants = [
        {"sync": "ps-async", "partitions": 2, "replicas": 3, "ps_shards": 2, "minibatch": 16,
         "push_every": 2, "pull_every": 3},
        {"sync": "ps-async", "partitions": 2, "replicas": 3, "ps_shards": 2, "minibatch": 16,
         "fc_protocol": "vectors"},
        {"sync": "ps-sync", "partitions": 1, "replicas": 5, "ps_shards": 2, "minibatch": 16,
         "fc_protocol": "vectors", "overlap": True},
        {"sync": "ps-async", "partitions": 4, "replicas": 2, "ps_shards": 4, "minibatch": 64,
         "overlap": True, "optimizer": "adam"},
        {"sync": "allreduce", "partitions": 2, "replicas": 6, "ps_shards": 0, "minibatch": 16,
         "overlap": True, "optimizer": "momentum", "epoch_fraction": 0.9},
    ]
    return grid + variants


def main() -> None:
    from dnnscale.model import predict_config
    from dnnscale.plan import config_from_dict
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    out = []
    for workload_name in WORKLOADS:
        workload = load_workload(workload_name)
        for cluster_ref in CLUSTERS:
            cluster = load_system(cluster_ref)
            for case in cases():
                config = config_from_dict(dict(case))
                prediction = predict_config(workload, cluster, config)
                out.append({"workload": workload_name,
                            "cluster": Path(cluster_ref).name if "/" in cluster_ref else cluster_ref,
                            "config": case, "prediction": prediction.to_dict(with_layers=True)})
    with gzip.open(HERE / "predict_v1.json.gz", "wt") as handle:
        json.dump(out, handle, allow_nan=True)
    print(f"{len(out)} cases written to {HERE / 'predict_v1.json.gz'}")


if __name__ == "__main__":
    main()
