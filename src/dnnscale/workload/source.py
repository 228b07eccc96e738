"""A workload from whatever a user hands over: a name or file (`load_workload`), or a PyTorch
model — an `nn.Module`, a factory of one, or ``package.module:factory`` on the command line —
with the shape of one input sample.

torch is imported only when the source is a PyTorch model (then it is already loaded, or the
user asked for it by naming a factory): `predict` and `optimize` of zoo names and YAML files
never import it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.workload import Workload

FACTORY_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""``package.module:factory``: dotted identifiers on both sides of one colon."""


def is_factory_spec(source: object) -> bool:
    """Whether `source` names a Python factory (``pkg.mod:make_net``) rather than a zoo name
    (``gpt:layers=...``, ``mlp:784-10``), an ``hf:`` config or an existing file."""
    if not isinstance(source, str) or not FACTORY_SPEC.fullmatch(source):
        return False
    return not _known_name(source)


def _exists(name: str) -> bool:
    """Whether `name` is an existing path (False for a name too long to be one)."""
    try:
        return Path(name).exists()
    except (OSError, ValueError):
        return False


def _known_name(source: str) -> bool:
    """Whether `source` is a zoo, parametric or hf: name, or an existing file."""
    from dnnscale.workload.zoo import PARAMETRIC, ZOO

    base = source.partition(":")[0]
    return base in PARAMETRIC or base in ZOO or base == "hf" or _exists(source)


def check_factory_spec(spec: str, field: str = "--torch") -> str:
    """`spec` if it has the form ``package.module:factory``, else InputError naming `field`
    (checked before torch is imported: a typo costs no seconds)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(field, f"expected package.module:factory, got {short_repr(spec)}")
    return spec


def is_torch_model(source: object) -> bool:
    """An `nn.Module` instance (False without importing torch when torch is not loaded: then
    nothing can be one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


def load_named(source: Any, field: str = "workload") -> Workload:
    """`load_workload`, with the errors that name the file of an ``hf:`` source naming `field`
    instead (the hf: loader names it as describe's --hf-config, which a user who typed
    ``-w hf:config.json`` did not type)."""
    from dnnscale.workload import load_workload

    try:
        return load_workload(source)
    except InputError as exc:
        if exc.field == "--hf-config" and field != "--hf-config":
            raise InputError(field, exc.problem) from None
        raise


def resolve_workload(source: Any, input_shape: Any = None, loss: str | None = None,
                     samples_per_epoch: int | None = None, field: str = "workload") -> Workload:
    """A Workload from a zoo name, YAML path, ``hf:`` config or Workload (`load_workload`),
    or from a PyTorch model with `input_shape` (one sample's shape without the batch, e.g.
    ``(3, 224, 224)``, or the CLI's text ``"3,224,224"``): an `nn.Module`, a zero-argument
    factory of one, or ``package.module:factory``. `loss`: None or ``"cross_entropy"``.

    Raises InputError naming `field` (or ``input_shape``) for a model without a shape, or a
    shape given for something that is not a model.
    """
    shape_field = "--input-shape" if field.startswith("-") else "input_shape"
    model = is_torch_model(source) or is_factory_spec(source) or (
        callable(source) and not isinstance(source, (str, Path, Workload)))
    if not model:
        if input_shape is not None or loss is not None:
            if isinstance(source, str) and ":" in source and not _known_name(source):
                raise InputError(field, f"{short_repr(source)} is no zoo name or file, and not "
                                 f"package.module:factory (dotted Python names on both sides "
                                 f"of one colon)")
            raise InputError(shape_field if input_shape is not None else "loss",
                             "only applies to a PyTorch model (an nn.Module, a factory, or "
                             "package.module:factory)")
        return load_named(source, field)
    if input_shape is None:
        example = "--input-shape 3,224,224" if shape_field.startswith("-") \
            else "input_shape=(3, 224, 224)"
        named = f"{short_repr(source)} is no zoo name or file; as package.module:factory, " \
            if isinstance(source, str) else ""
        raise InputError(shape_field, f"{named}a PyTorch model needs the shape of one input "
                         f"sample without the batch, e.g. {example}")
    from dnnscale.workload.torch_import import from_torch, load_factory, parse_input_shapes

    dtypes = None
    try:
        if isinstance(input_shape, str):
            shapes, dtypes = parse_input_shapes(input_shape)
            input_shape = shapes[0] if len(shapes) == 1 else shapes
        name = None
        if isinstance(source, str):
            name = source.partition(":")[2]
            source = load_factory(source)
        extra = {} if samples_per_epoch is None else {"samples_per_epoch": samples_per_epoch}
        return from_torch(source, input_shape, name=name, input_dtypes=dtypes, loss=loss,
                          **extra)
    except InputError as exc:
        if exc.field in ("--torch", "torch"):  # the importer's names for the model itself
            raise InputError(field, exc.problem) from None
        if exc.field in ("--input-shape", "input_shape"):
            raise InputError(shape_field, exc.problem) from None
        raise
