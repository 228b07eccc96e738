"""Validation outputs: Markdown table, JSON, predicted-vs-measured scatter, scalability curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pct(value: float | None) -> str:
    return "—" if value is None or value != value else f"{100 * value:.1f} %"


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"# Validation: {result['workload']} on testbed {result['testbed']}", "",
             f"{result['note']}", "",
             f"Network: {result['network']}. Each configuration ran {result['repeats']} "
             f"time{'s' if result['repeats'] != 1 else ''} "
             f"({result['steps']} timed steps after {result['warmup']} warm-up steps); measured = "
             "median over repeats, spread = (max − min) / median.", "",
             "| id | set | configuration | machines | predicted samples/s | measured samples/s | "
             "spread | error | Paleo error | Optimus error | bottleneck predicted | observed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        m = row["measured"]
        lines.append(
            f"| {row['id']} | {row['set']} | {row['label']} | {row['machines']} | "
            f"{row['predicted_throughput_samples_per_s']:.1f} | {m['throughput_samples_per_s']:.1f} | "
            f"{_pct(m['spread'])} | {_pct(row.get('relative_error'))} | "
            f"{_pct(row.get('paleo_relative_error'))} | {_pct(row.get('optimus_relative_error'))} | "
            f"{row['predicted_bottleneck']} | {m['observed_bottleneck']} |")
    lines += ["", "| predictor | configs | median error | p90 error | max error | Kendall τ |",
              "|---|---|---|---|---|---|"]
    for name, figures in (("dnnscale", s), *((k, v) for k, v in s["baselines"].items())):
        lines.append(f"| {name} | {s['configs']} | {_pct(figures['median_relative_error'])} | "
                     f"{_pct(figures['p90_relative_error'])} | {_pct(figures['max_relative_error'])} | "
                     f"{figures.get('kendall_tau', float('nan')):.2f} |")
    opt = result.get("optimizer")
    if opt:
        ps = f", {opt['ps_machines']} of them PS hosts" if opt.get("ps_machines") else ""
        lines += ["", f"Optimizer (budget {opt['machines']} machines{ps}) chose {opt['label']}: "
                  f"measured {opt['measured_throughput_samples_per_s']:.1f} samples/s; best measured "
                  f"{opt['best_label']} at {opt['best_measured_throughput_samples_per_s']:.1f} "
                  f"samples/s; regret {_pct(s['regret'])}."]
    over = [row for row in result["rows"] if row.get("reason")]
    if over:
        lines += ["", "Rows over 15 % error, and the phase that separates prediction from "
                  "measurement most (seconds per worker step; runtime phases, model parts mapped "
                  "by validate/reasons.py):", ""]
        lines += [f"- {row['id']} ({row['set']}, {row['label']}, {_pct(row['relative_error'])}): "
                  f"{row['reason']}" for row in over]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], out_dir: Path, html: Path | None = None) -> list[Path]:
    """results.json, table.md, scatter.png, curves.png and report.html under `out_dir` (the
    HTML at `html` instead when given)."""
    from dnnscale.atomic import atomic_write_text
    from dnnscale.jsonout import dumps, strict
    from dnnscale.report.pages import validation_page, write_html

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "table.md"]
    atomic_write_text(paths[0], dumps(result), "--output")
    atomic_write_text(paths[1], markdown(result), "--output")
    paths += plot(result, out_dir)
    paths.append(write_html(validation_page(strict(result)), html or out_dir / "report.html",
                            "--html" if html else "--output"))
    return paths


def _title(result: dict[str, Any], what: str) -> str:
    """'adam-cifar10 on testbed tb (100 Mbit/s): predicted vs measured'."""
    where = f" on testbed {result['testbed']}" if result.get("testbed") else ""
    network = f" ({result['network']})" if result.get("network") else ""
    return f"{result.get('workload', '?')}{where}{network}: {what}"


def plot(result: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["set"] != "calibration"]
    scatter = out_dir / "scatter.png"
    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = {"ps-async": "o", "ps-sync": "s", "allreduce": "^"}
    for sync, marker in markers.items():
        chosen = [r for r in rows if r["config"]["sync"] == sync]
        if chosen:
            ax.scatter([r["measured"]["throughput_samples_per_s"] for r in chosen],
                       [r["predicted_throughput_samples_per_s"] for r in chosen], marker=marker,
                       label=sync)
    values = [v for r in rows for v in (r["measured"]["throughput_samples_per_s"],
                                        r["predicted_throughput_samples_per_s"])]
    low, high = min(values) * 0.8, max(values) * 1.25
    ax.plot([low, high], [low, high], "k--", linewidth=0.8, label="exact")
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1], alpha=0.1,
                    color="gray", label="±10 %")
    ax.set(xscale="log", yscale="log", xlabel="measured samples/s", ylabel="predicted samples/s")
    ax.set_title(_title(result, "predicted vs measured throughput"), fontsize=9)
    ax.legend()
    fig.tight_layout()
    _save(fig, scatter)
    plt.close(fig)

    curves = out_dir / "curves.png"
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for key, label, style in (("measured", "measured best", "o-"),
                              ("predicted", "predicted best (same runs)", "s--")):
        best: dict[int, float] = {}
        for r in rows:
            value = (r["measured"]["throughput_samples_per_s"] if key == "measured"
                     else r["predicted_throughput_samples_per_s"])
            best[r["machines"]] = max(best.get(r["machines"], 0.0), value)
        xs = sorted(best)
        # best over configurations using at most that many machines
        ys, top = [], 0.0
        for x in xs:
            top = max(top, best[x])
            ys.append(top)
        ax.plot(xs, ys, style, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.set(xlabel="machines used", ylabel="best samples/s (over plans on at most that many)")
    ax.set_title(_title(result, "best throughput per machine count, measured vs predicted"),
                 fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    _save(fig, curves)
    plt.close(fig)
    return [scatter, curves]


def _save(figure: Any, path: Path) -> None:
    """Save a PNG atomically (an existing one stays until the new one is whole)."""
    from dnnscale.atomic import atomic_output

    with atomic_output(path, "--output") as temporary:
        figure.savefig(temporary, format="png", dpi=110)
