"""Options are validated once, with errors that name the parameter."""

from __future__ import annotations

import pytest

from rlnorm.options import OpOptions


def test_swish_is_silu_eps_zero_is_allowed_and_defaults_are_qwen3_next() -> None:
    assert OpOptions(activation="swish").activation == "silu"
    o = OpOptions()
    assert (o.eps, o.group_size, o.norm_before_gate, o.activation) == (1e-6, None, True, "silu")
    # FLA's own tests use eps = 0
    assert OpOptions(eps=0).eps == 0.0 and isinstance(OpOptions(eps=0).eps, float)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"eps": -1e-6}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"eps": True}, "eps"),
        ({"group_size": 0}, "group_size"),
        ({"group_size": 2.0}, "group_size"),
        ({"norm_before_gate": 1}, "norm_before_gate"),
        ({"activation": "gelu"}, "activation"),
    ],
)
def test_bad_options_name_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        OpOptions(**kwargs)


def test_group_size_must_divide_width() -> None:
    OpOptions(group_size=32).check_width(128)
    with pytest.raises(ValueError, match="group_size: 48 does not divide"):
        OpOptions(group_size=48).check_width(128)
