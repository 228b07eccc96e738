"""Which accelerator a GPU command runs on: the one check that `calibrate --gpu` and
`run --gpu` share. torch is imported inside the functions."""

from __future__ import annotations

import re
from typing import Any

from dnnscale.errors import InputError, short_repr

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


def cuda_device(text: str, flag: str = "--gpu") -> Any:
    """The torch.device `text` names ('cuda' or 'cuda:N'), checked against this machine.

    Without CUDA: InputError(`flag`, NO_CUDA) — the command cannot do what was asked here, and
    says so in one line (exit 2, like any request this machine cannot honour)."""
    match = re.fullmatch(r"cuda(?::(\d{1,6}))?", text.strip())
    if match is None:  # before torch is imported: a typo costs no seconds
        raise InputError("--device", f"must be cuda or cuda:N, got {short_repr(text)}")
    import torch

    if not torch.cuda.is_available():
        raise InputError(flag, NO_CUDA)
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise InputError("--device", f"{short_repr(text)}: this machine has {count} CUDA device"
                         f"{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def synchronize(device: Any) -> None:
    """Wait for `device`'s queued work (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def failure_reason(exc: BaseException) -> str:
    """One line for a failed kernel or run: 'out of memory', else the error's type and the
    first line of its message (at most 200 characters)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "out of memory"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
