"""The chosen plan as another engine's launch configuration (docs/export.md).

`export_plan(source, engine)` reads a plan file or the JSON of `optimize --json` / `predict
--json` (export/plan_source.py), loads the workload it trains (the file's ``workload`` key or
the `workload` argument) and hands both to one engine's exporter:

- ``megatron``: Megatron-LM's command-line options (export/megatron.py);
- ``deepspeed``: a ds_config JSON and Megatron-DeepSpeed's options (export/deepspeed.py);
- ``torchtitan``: a TOML job config (export/torchtitan.py).

Each maps every plan field to the engine's own option or refuses it with an `InputError`
naming the field and the engine. Nothing here imports torch or any engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dnnscale.errors import InputError
from dnnscale.export.assumptions import with_assumptions
from dnnscale.export.result import EngineExport, ExportFile, with_kernel_note
from dnnscale.plan.engines import ENGINES, check_engine

__all__ = ["ENGINES", "EngineExport", "ExportFile", "export_plan"]


def export_plan(source: "str | Path", engine: str, workload: "str | None" = None,
                **options: Any) -> EngineExport:
    """Export the plan at `source` for `engine`; `workload` names the workload when the file
    does not (and must agree with it when it does). options: megatron's `output_format`
    ('args' | 'torchrun') and `gpus_per_node`; deepspeed's `config_name`."""
    from dnnscale.export.plan_source import WORKLOAD_KEY, read_plan_source

    check_engine(engine, "--to")
    plan_source = read_plan_source(source, "plan")
    name = workload if workload is not None else plan_source.workload
    if name is None:
        raise InputError("--workload", "the plan file names no workload: give -w/--workload "
                         "(the model whose layer flags the engine needs)")
    try:
        return _export(plan_source, name, workload, engine, options)
    except InputError as exc:  # name what the user gave: -w, or the file's workload key
        if exc.field not in ("workload", "--hf-config"):
            raise
        raise InputError("--workload" if workload is not None else f"plan.{WORKLOAD_KEY}",
                         exc.problem) from None


def _export(plan_source: Any, name: str, workload: "str | None", engine: str,
            options: dict[str, Any]) -> EngineExport:
    from dnnscale.plan.flags import check_plan_workload
    from dnnscale.workload import load_workload

    loaded = load_workload(name)
    in_file = plan_source.workload
    check_plan_workload(workload, in_file, loaded.name, "the plan file", "--workload")
    shape = loaded.transformer
    if engine == "megatron":
        from dnnscale.export.megatron import export_megatron

        result = export_megatron(plan_source.plan, shape, loaded.name, **options)
    elif engine == "deepspeed":
        from dnnscale.export.deepspeed import export_deepspeed

        result = export_deepspeed(plan_source.plan, shape, loaded.name, **options)
    else:
        from dnnscale.export.torchtitan import export_torchtitan

        result = export_torchtitan(plan_source.plan, shape, loaded.name, **options)
    return with_assumptions(with_kernel_note(result, shape, engine), plan_source.plan, shape)

