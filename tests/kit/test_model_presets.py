"""The model presets hold what the installed transformers' configurations say, and every line they cite exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers

from rlnorm.kit.params import load_params

MODELS = Path(__file__).resolve().parents[2] / "params" / "models"
SRC = Path(transformers.__file__).parent / "models"


def _expected(stem: str) -> dict:
    """d, eps, group_size, norm_before_gate, activation, computed from the config class's defaults."""
    if stem in ("qwen3_next", "qwen3_5"):
        cfg = transformers.Qwen3NextConfig() if stem == "qwen3_next" else transformers.Qwen3_5TextConfig()
        return {"d": cfg.linear_value_head_dim, "eps": cfg.rms_norm_eps, "group_size": None,
                "norm_before_gate": True, "activation": cfg.hidden_act}  # fmt: skip
    if stem == "kimi_linear":
        cfg = transformers.KimiLinearConfig()
        return {"d": cfg.linear_head_dim, "eps": cfg.rms_norm_eps, "group_size": None, "norm_before_gate": True,
                "activation": "sigmoid"}  # fmt: skip
    if stem == "nemotron_h":
        cfg = transformers.NemotronHConfig()
        d = cfg.mamba_num_heads * cfg.mamba_head_dim
        return {"d": d, "eps": cfg.layer_norm_epsilon, "group_size": d // cfg.n_groups, "norm_before_gate": False,
                "activation": cfg.mamba_hidden_act}  # fmt: skip
    cfg = transformers.GraniteMoeHybridConfig()
    assert cfg.mamba_n_groups == 1  # one group: the whole row
    return {"d": cfg.mamba_expand * cfg.hidden_size, "eps": cfg.rms_norm_eps, "group_size": None,
            "norm_before_gate": False, "activation": cfg.hidden_act}  # fmt: skip


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_preset_is_its_models_config_and_cites_lines_that_exist(path: Path) -> None:
    p = load_params(path)
    got = {k: getattr(p, k) for k in ("d", "eps", "group_size", "norm_before_gate", "activation")}
    assert got == _expected(path.stem)
    text = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    # "file.py:N (attribute" or ":N (attribute": that line (or range) of that file holds the attribute
    file, checked = None, 0
    for name, first, last, attr in re.findall(r"(\w+\.py)?:(\d+)(?:-(\d+))? \((\w+)", text):
        if name:
            (file,) = [f for f in SRC.rglob(name) if f.parent.name in text]  # the model folder the comment names
        assert file is not None
        lines = file.read_text().splitlines()[int(first) - 1 : int(last or first)]
        assert any(attr in line for line in lines), f"{file.name}:{first} does not hold {attr}"
        checked += 1
    assert checked >= 2
