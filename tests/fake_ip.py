"""A fake `ip` on PATH for prefix tests without root: `ip netns exec NS CMD...` just runs CMD."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def install_fake_ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a fake `ip` first on PATH; return its path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_ip = bin_dir / "ip"
    fake_ip.write_text('#!/bin/sh\n[ "$1 $2" = "netns exec" ] || exit 9\nshift 3\nexec "$@"\n')
    fake_ip.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return fake_ip
