"""`--variant`: parsing, grouping and labels, names checked against the kernel's switches, and a variant's line
timed under its switches beside the others (the kernel's `variant` is a fake here: the test is the bench's)."""

from __future__ import annotations

import contextlib
import json
import sys
import types

import pytest
import torch
from bench_fakes import TINY, Eager, FixedClock, by_key

import rlnorm.kernel.api  # noqa: F401  (the real kernel stays importable under the fake module below)
from rlnorm.bench import cli, runner, variants
from rlnorm.bench.variants import Variant, VariantBackend, VariantError, parse_variant, parse_variants


class FakeKernel(types.ModuleType):
    """`rlnorm.kernel` with the interface the bench expects: variant(fwd=, bwd=) and the switch lists."""

    def __init__(self, listed: bool = True) -> None:
        super().__init__("rlnorm.kernel")
        self.active: list[dict] = []  # the switches in force, innermost last
        self.entered: list[dict] = []
        if listed:
            self.FWD_SWITCHES = {"EXACT": 1, "TIER2": 1}
            self.BWD_SWITCHES = {"STAGES": 2}

    @contextlib.contextmanager
    def variant(self, fwd=None, bwd=None):
        for part, given in (("fwd", fwd), ("bwd", bwd)):
            known = {"fwd": ("EXACT", "TIER2"), "bwd": ("STAGES",)}[part]
            for name in given or {}:
                if name not in known:
                    raise ValueError(f"planted: {part} switch {name!r} is unknown")
        state = {"fwd": dict(fwd or {}), "bwd": dict(bwd or {})}
        self.entered.append(state)
        self.active.append(state)
        try:
            yield
        finally:
            self.active.pop()


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setitem(sys.modules, "rlnorm.kernel", fake)
    return fake


class Recording(Eager):
    """Records the switches in force at each call, to show that no call of a variant's line runs without them."""

    def __init__(self, kernel: FakeKernel) -> None:
        super().__init__()
        self.kernel, self.seen = kernel, []

    def _fn(self, x, z, w, opts):
        self.seen.append(dict(self.kernel.active[-1]) if self.kernel.active else None)
        return super()._fn(x, z, w, opts)


def test_a_variant_is_parsed_grouped_and_labelled():
    v = parse_variant("fwd.EXACT=0")
    assert v.switches() == {"fwd": {"EXACT": 0}, "bwd": None} and v.label == "rlnorm[fwd.EXACT=0]"
    both = parse_variant(" fwd.EXACT=0, bwd.STAGES=1 ")  # commas join one variant's switches
    assert both.switches() == {"fwd": {"EXACT": 0}, "bwd": {"STAGES": 1}}
    assert both.label == "rlnorm[fwd.EXACT=0,bwd.STAGES=1]"
    two = parse_variants(["fwd.EXACT=0", "bwd.STAGES=1"])  # repeated flags: one line each
    assert [x.label for x in two] == ["rlnorm[fwd.EXACT=0]", "rlnorm[bwd.STAGES=1]"]
    values = parse_variant("fwd.A=0x10,fwd.B=2.5,fwd.C=true,fwd.D=None,fwd.E=-3").switches()["fwd"]
    assert values == {"A": 16, "B": 2.5, "C": True, "D": None, "E": -3}
    assert parse_variants(None) == [] and parse_variants([]) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty string"),
        ("EXACT=0", "expected fwd.NAME=VALUE"),
        ("fwd.EXACT", "expected fwd.NAME=VALUE"),
        ("fwd.EXACT=", "expected fwd.NAME=VALUE"),
        ("mid.EXACT=0", "must be fwd or bwd"),
        ("fwd.2X=0", "not a switch name"),
        ("fwd.EXACT=O", "expected an integer"),  # the letter O: a typo, not a value
        ("fwd.EXACT=0,fwd.EXACT=1", "twice"),
        ("fwd.EXACT=0,", "expected fwd.NAME=VALUE"),
    ],
)
def test_bad_variant_syntax_is_refused_with_the_reason(spec, message):
    with pytest.raises(VariantError, match=message):
        parse_variant(spec)


def test_the_same_variant_twice_is_refused():
    with pytest.raises(VariantError, match="given twice"):
        parse_variants(["fwd.EXACT=0,bwd.STAGES=1", "bwd.STAGES=1,fwd.EXACT=0"])


def test_names_are_checked_against_the_kernels_switches(fake_kernel):
    variants.validate(parse_variants(["fwd.EXACT=0", "bwd.STAGES=1"]))
    with pytest.raises(VariantError, match=r"fwd\.NOPE is not a switch of this kernel \(fwd: EXACT, TIER2\)"):
        variants.validate(parse_variants(["fwd.EXACT=0", "fwd.NOPE=1"]))
    with pytest.raises(VariantError, match=r"bwd\.EXACT"):  # a forward switch named for the backward
        variants.validate(parse_variants(["bwd.EXACT=0"]))


def test_a_kernel_without_switches_is_said_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "rlnorm.kernel", types.ModuleType("rlnorm.kernel"))
    with pytest.raises(VariantError, match="has no switches"):
        variants.validate(parse_variants(["fwd.EXACT=0"]))
    variants.validate([])  # no variant asked for: nothing imported, nothing refused


def test_a_variant_line_runs_every_call_under_its_switches(fake_kernel):
    plain, under = Recording(fake_kernel), Recording(fake_kernel)
    line = VariantBackend(parse_variant("fwd.EXACT=0,bwd.STAGES=1"), base=under)
    shape = runner.bench_shape(3, 128, [plain, line], "cpu", FixedClock(10.0), TINY)
    by = by_key(shape)
    want = {"fwd": {"EXACT": 0}, "bwd": {"STAGES": 1}}
    assert under.seen and all(s == want for s in under.seen)  # the probe's calls and every timed call
    assert plain.seen and all(s is None for s in plain.seen)  # the plain line never under the switches
    for mode in ("fwd", "fwd_bwd"):
        e = by[("rlnorm[fwd.EXACT=0,bwd.STAGES=1]", mode)]
        assert e["status"] == "ok" and e["add_us"] == by[("eager_test", mode)]["add_us"]  # the same run's add
    assert shape["fastest_peer"]["fwd"]["name"] == "eager_test"  # a variant is not a peer
    # entered once for the probe and once around all of the line's timed calls (never inside the timing)
    assert len(fake_kernel.entered) == 2


def test_a_switch_the_kernel_refuses_makes_the_line_unavailable_not_plain(fake_kernel):
    under = Recording(fake_kernel)
    line = VariantBackend(Variant(fwd=(("NOPE", 1),), text=("fwd.NOPE=1",)), base=under)
    shape = runner.bench_shape(3, 128, [line], "cpu", FixedClock(), TINY)
    e = by_key(shape)[("rlnorm[fwd.NOPE=1]", "fwd")]
    assert e["status"] == "unavailable" and "planted: fwd switch 'NOPE' is unknown" in e["reason"]
    assert under.seen == []  # nothing ran without the switch


def test_a_call_outside_the_bench_still_gets_the_switches(fake_kernel):
    under = Recording(fake_kernel)
    line = VariantBackend(parse_variant("fwd.TIER2=0"), base=under)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    line.forward(x, x, torch.ones(8, dtype=torch.bfloat16), runner.OpOptions())
    assert under.seen == [{"fwd": {"TIER2": 0}, "bwd": {}}] and fake_kernel.active == []


ARGS = ["--d", "128", "--rows", "2", "--small-rows", "--backends", "reference", "--smoke", "--no-progress"]


def test_the_cli_refuses_an_unknown_switch_before_any_timing(fake_kernel, monkeypatch, capsys):
    called = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: called.append(1))
    assert cli.main([*ARGS, "--variant", "fwd.NOPE=1"]) == 2
    assert "fwd.NOPE is not a switch" in capsys.readouterr().err and not called
    assert cli.main([*ARGS, "--variant", "fwd.EXACT"]) == 2
    assert "expected fwd.NAME=VALUE" in capsys.readouterr().err and not called


def test_the_cli_puts_each_variant_beside_rlnorm(fake_kernel, monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    got = {}

    def fake_load(keys):
        got["keys"] = list(keys)
        loaded = [Recording(fake_kernel) for _ in keys]
        for b, key in zip(loaded, keys, strict=True):
            b.key = key
        return loaded

    monkeypatch.setattr(runner, "load_backends", fake_load)
    monkeypatch.setattr(variants, "RlnormBackend", lambda: Recording(fake_kernel))
    out = tmp_path / "v.json"
    argv = [*ARGS, "--variant", "fwd.EXACT=0", "--variant", "bwd.STAGES=1", "--out", str(out)]
    assert cli.main(argv) == 0
    assert got["keys"] == ["rlnorm", "reference"]  # a variant needs plain rlnorm beside it
    doc = json.loads(out.read_text())
    assert doc["variants"] == {
        "rlnorm[fwd.EXACT=0]": {"fwd": {"EXACT": 0}, "bwd": None},
        "rlnorm[bwd.STAGES=1]": {"fwd": None, "bwd": {"STAGES": 1}},
    }
    names = list(dict.fromkeys(e["name"] for e in doc["shapes"][0]["entries"]))
    assert names == ["torch.add", "rlnorm", "rlnorm[fwd.EXACT=0]", "rlnorm[bwd.STAGES=1]", "reference"]
    assert doc["command"] == (
        "python -m rlnorm bench --d 128 --rows 2 --small-rows --backends reference --smoke "
        "--variant fwd.EXACT=0 --variant bwd.STAGES=1"
    )
