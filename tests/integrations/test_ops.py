"""`torch.ops.rlnorm.rms_norm_gated`: rlnorm's forward, bitwise, and one opaque node under torch.compile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import rlnorm
from rlnorm.inputs import make_case
from rlnorm.integrations.ops import rms_norm_gated_op
from rlnorm.reference import rms_norm_gated_reference


def _rows(n: int, d: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c = make_case(n, d, seed=6)
    return c.x, c.z, c.w


OPTIONS = [
    (1e-6, None, True, "silu"),
    (1e-5, 8, False, "swish"),
    (1e-3, 16, True, "sigmoid"),
]


@pytest.mark.parametrize(("eps", "group_size", "norm_before_gate", "activation"), OPTIONS)
def test_the_op_is_rlnorm_bitwise(eps: float, group_size: int | None, norm_before_gate: bool, activation: str) -> None:
    x, z, w = _rows(7)
    y = torch.ops.rlnorm.rms_norm_gated(x, z, w, eps, group_size, norm_before_gate, activation)
    opts = {"group_size": group_size, "norm_before_gate": norm_before_gate, "activation": activation}
    assert torch.equal(y, rlnorm.rms_norm_gated(x, z, w, eps=eps, **opts))
    assert torch.equal(
        torch.ops.rlnorm.rms_norm_gated(x, None, w, eps, None, True, "silu"), rlnorm.rms_norm_gated(x, None, w, eps=eps)
    )
    args = (x, z, w, eps, group_size, norm_before_gate, activation)
    torch.library.opcheck(rms_norm_gated_op, args, test_utils=("test_schema", "test_faketensor"))  # and well declared


def _graph_of(fn: Callable[..., torch.Tensor], *args: Any) -> str:
    graphs: list[str] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(str(gm.graph))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return graphs[0]


def _through_the_op(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return rms_norm_gated_op(x.reshape(-1, x.shape[-1]), z.reshape(-1, z.shape[-1]), w, 1e-6, None, True, "silu")


def test_dynamo_keeps_the_op_whole_and_would_see_a_pytorch_body() -> None:
    x, z, w = _rows(5)
    graph = _graph_of(_through_the_op, x, z, w)
    assert "rlnorm.rms_norm_gated" in graph and "rsqrt" not in graph
    planted = _graph_of(rms_norm_gated_reference, x, z, w)  # a body Inductor would re-derive: the inspection sees it
    assert "rlnorm.rms_norm_gated" not in planted and ("rsqrt" in planted or "sqrt" in planted)


@pytest.mark.slow
def test_inductor_runs_the_kernel_itself_at_every_row_count() -> None:
    x, z, w = _rows(37)
    ref = rlnorm.rms_norm_gated(x, z, w)
    torch._dynamo.reset()
    compiled = torch.compile(_through_the_op, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for n in (37, 5, 1):
            assert torch.equal(compiled(x[:n], z[:n], w), ref[:n])


@pytest.mark.gpu
def test_on_the_gpu_inductor_and_a_cuda_graph_run_the_kernel_itself() -> None:
    x, z, w = (t.cuda() for t in _rows(4097, d=128))
    ref = rlnorm.rms_norm_gated(x, z, w)
    torch._dynamo.reset()
    compiled = torch.compile(_through_the_op, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for n in (4097, 257, 7, 1):
            assert torch.equal(compiled(x[:n], z[:n], w), ref[:n])
        xs, zs = x[:64].clone(), z[:64].clone()
        _through_the_op(xs, zs, w)  # compile and warm the kernel outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _through_the_op(xs, zs, w)
        xs.copy_(x[64:128])
        zs.copy_(z[64:128])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref[64:128])
