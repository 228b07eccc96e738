"""The overlap and straggler calibration: the γ fit by hand, the profile fields, and how a
cluster takes them (its overlap_gamma and straggler_spread come from the profile)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from dnnscale.calibrate.overlap import GAMMA_MAX, fit_gamma
from dnnscale.errors import InputError
from dnnscale.system import load_system
from dnnscale.system.profile import (OverlapFit, StragglerSpread, profile_from_dict,
                                     profile_to_dict)

PROFILE = Path(__file__).parent.parent / "results" / "validation" / "wave1" / "profile-100mbit.yaml"


def test_fit_gamma_by_hand() -> None:
    """(3, 4) -> 5 is the 2-norm; 3 + 4 = 7 no overlap (γ = 1); max = 4 full overlap (∞)."""
    assert fit_gamma([[3.0, 4.0, 5.0]]) == pytest.approx(2.0, rel=1e-6)
    assert fit_gamma([[3.0, 4.0, 7.0]]) == 1.0
    assert fit_gamma([[3.0, 4.0, 4.0]]) == math.inf
    # two points, from γ = 3: (1, 1) -> 2^(1/3) = 1.26 and (1, 2) -> (1 + 8)^(1/3) = 2.08
    assert fit_gamma([[1.0, 1.0, 2 ** (1 / 3)], [1.0, 2.0, 9 ** (1 / 3)]]) == \
        pytest.approx(3.0, rel=1e-6)
    # measurements slower than no overlap at all still fit γ = 1; faster than max: ∞
    assert fit_gamma([[1.0, 1.0, 2.5]]) == 1.0 and fit_gamma([[1.0, 1.0, 0.9]]) == math.inf
    assert GAMMA_MAX == 64.0
    with pytest.raises(ValueError):
        fit_gamma([[0.0, 1.0, 1.0]])


def _profile_data() -> dict:
    """The committed testbed profile (made before these fields existed)."""
    return yaml.safe_load(PROFILE.read_text())


def test_profile_fields_round_trip() -> None:
    data = _profile_data()
    data["overlap"] = {"gamma": 2.5, "points": [[0.01, 0.02, 0.022]]}
    data["stragglers"] = {"spread": 0.03, "processes": 4, "steps": 60,
                          "mean_step_s": [0.01, 0.0102, 0.0099, 0.0101]}
    profile = profile_from_dict(data)
    assert profile.overlap == OverlapFit(2.5, ((0.01, 0.02, 0.022),))
    assert profile.stragglers == StragglerSpread(0.03, 4, 60, (0.01, 0.0102, 0.0099, 0.0101))
    again = profile_from_dict(profile_to_dict(profile))
    assert again.overlap == profile.overlap and again.stragglers == profile.stragglers
    data["overlap"] = {"gamma": "inf"}
    assert profile_from_dict(data).overlap == OverlapFit(math.inf)
    assert profile_to_dict(profile_from_dict(data))["overlap"]["gamma"] == "inf"
    for bad, field in (({"gamma": 0.5}, "profile.overlap.gamma"),
                       ({"gamma": 2, "points": [[1, 2]]}, "profile.overlap.points")):
        data["overlap"] = bad
        with pytest.raises(InputError, match=field):
            profile_from_dict(data)
    data["overlap"] = None
    data["stragglers"] = {"spread": -1}
    with pytest.raises(InputError, match="profile.stragglers.spread"):
        profile_from_dict(data)


def test_cluster_takes_gamma_and_spread_from_its_profile(tmp_path: Path) -> None:
    data = _profile_data()
    data["overlap"] = {"gamma": 3.0, "points": []}
    data["stragglers"] = {"spread": 0.7}   # more than a cluster may state: capped at 0.5
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    cluster = tmp_path / "c.yaml"
    cluster.write_text("machines: 4\nmachine: {cores: 1, memory: 4GB}\nnetwork: {}\n"
                       "overlap_gamma: 10\nprofile: p.yaml\n")
    system = load_system(str(cluster))
    assert system.overlap_gamma == 3.0 and system.straggler_spread == 0.5
    del data["overlap"], data["stragglers"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    system = load_system(str(cluster))  # without the fields: the cluster's own values
    assert system.overlap_gamma == 10.0 and system.straggler_spread == 0.0
