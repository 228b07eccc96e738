"""What every rank of a run is told: the job spec (JSON-serialisable, no torch)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dnnscale.plan import Config, config_from_dict


@dataclass(frozen=True)
class RunSpec:
    """workload: zoo name or YAML path; config: Config fields; output: JSONL path (every rank
    appends); timeout_s: how long a rank may wait on a peer (process-group timeout) or, under
    the launcher, stay silent; lr: SGD learning rate; seed: weights and data."""

    workload: str
    config: dict[str, Any]
    steps: int
    warmup: int
    timeout_s: float
    output: str
    lr: float = 0.1
    seed: int = 0
    conv_split: str | dict[str, str] = "channels"  # "rows", or conv layer name -> either

    def config_obj(self) -> Config:
        return config_from_dict(dict(self.config))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return cls(**json.loads(text))

    def save(self, path: Path) -> None:
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "RunSpec":
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
