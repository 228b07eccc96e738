"""Issue 26's bad-input cases for one area (gpu); see tests/fuzz_cases.py for `Case`."""

from __future__ import annotations

from collections.abc import Iterator

from tests.fuzz_cases import Case


def cases() -> Iterator[Case]:
    return iter(())
