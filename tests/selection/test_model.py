"""The selection model's held-out error (gemmgen.selection.dispatch.model.evaluate) and `gemmgen
model`, which reports it, on made-up measurements: no GPU."""

import math

import numpy as np
import pytest
from stored import store

from gemmgen.cli.main import main
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Shape
from gemmgen.selection.dispatch.model import Sample, _base, evaluate, stored_samples
from gemmgen.store.db import ResultsDB

SM90 = parse_arch("sm_90")
# kernel -> its calibration in the made-up law: how much slower than the model's base it runs
LAW = {"hopper_128x256_c2_s4_g8_ov_fp16": 0.25, "hopper_64x128_c1_s8_g4_fp16": 0.45, "hopper_32x64_c1_s8_sw_fp16": 0.7}
SHAPES = [Shape(m, n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)) for m in (16, 64, 256, 1024, 4096)]


def _config(name: str):
    family, precision, params = point_spec(name)
    return make_config(family, params, precision, SM90)


def _configs():
    return {name: _config(name) for name in LAW}


def _law_samples(noise: float) -> list[Sample]:
    """Each kernel at each of SHAPES, twice: base x e^calibration, times 1 +- ``noise`` (fixed, not random)."""
    configs, out = _configs(), []
    for i, (name, u) in enumerate(LAW.items()):
        for j, s in enumerate(SHAPES):
            base = _base(configs[name], np.array([s.m]), s.n, s.k, 132)[0][0] * 1e6 * math.exp(u)
            for rep in (0, 1):
                out.append(Sample(name, s, base * (1.0 + noise * math.sin(7 * i + 3 * j + rep))))
    return out


def test_a_model_fitted_on_a_known_law_predicts_held_out_measurements_of_it():
    found = evaluate(_law_samples(0.01), _configs(), 132)
    assert found.held_out == len(LAW) * len(SHAPES) and found.folds == 5  # every pair predicted once
    assert found.median < 0.02 and found.p90 < 0.03
    assert list(found.by_basis) == ["measured at this layer"]  # every kernel was measured at every M of each layer
    assert evaluate(_law_samples(0.01), _configs(), 132) == found  # the same figure every time


def test_what_is_held_out_is_not_fitted():
    """Times that follow no law: at a measured shape the model gives back the measurement, so an
    error this large shows the held-out pairs were not in the fit."""
    samples = [Sample(s.kernel, s.shape, s.us * (1.0 + 0.6 * math.sin(11 * i) ** 2))
               for i, s in enumerate(_law_samples(0.0)[::2])]
    assert evaluate(samples, _configs(), 132).median > 0.1


def test_too_few_measurements_to_hold_any_out():
    one = _law_samples(0.0)[:2]  # one kernel at one shape, twice
    found = evaluate(one, _configs(), 132)
    assert found.held_out == 0 and math.isnan(found.median)
    assert found.text() == "no held-out error: too few measurements to hold any out"


def _stored_law(tmp_path):
    """A results database of _law_samples(0.01), each measurement next to a cuBLAS one."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    for s in _law_samples(0.01):
        flops = 2.0 * s.shape.m * s.shape.n * s.shape.k
        store(db, "cublas_fp16", "cublas", "fp16", s.shape, 500.0)
        store(db, s.kernel, "hopper", "fp16", s.shape, flops / (s.us * 1e6))
    return db, url


def test_gemmgen_model_prints_the_held_out_error(capsys, tmp_path):
    db, url = _stored_law(tmp_path)
    found = evaluate(*stored_samples(db, "fp16", SM90, batch_count=None)[:3])
    assert main(["model", "--precision", "fp16", "--gpu", "sm_90", "--db", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("selection model of fp16 (variant nn fp32 none none) for sm_90: 90 measurements of 3 kernels "
                      "on H100 (132 SMs)")
    assert out[1] == f"  {found.text()}" and f"median error {100 * found.median:.1f}% " in out[1]
    assert found.median < 0.02


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp64"], "argument --precision: invalid choice: 'fp64'"),
    (["--precision", "bf16"], "no verified bf16 measurement of variant nn fp32 none none"),
])
def test_gemmgen_model_errors_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    _, url = _stored_law(tmp_path)
    assert main(["model", *argv, "--gpu", "sm_90", "--db", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


def test_a_kernel_measured_nowhere_borrows_from_a_similar_kernel_measured_on_the_layer():
    """BIG's sibling with one stage fewer (one parameter apart, the same base) is predicted at a
    shape BIG was measured at as BIG's measurement; a kernel of another tile and stages is not
    similar enough and is predicted from its parameters."""
    from gemmgen.selection.dispatch.model import TimeModel

    samples = _law_samples(0.01)
    model = TimeModel.fit(samples, _configs(), 132)
    big, shape = "hopper_128x256_c2_s4_g8_ov_fp16", SHAPES[7]
    measured = sorted(s.us for s in samples if (s.kernel, s.shape) == (big, shape))
    sibling = _config("hopper_128x256_c2_s3_g8_ov_fp16")
    assert model.predict(sibling, shape) == pytest.approx((measured[0] + measured[1]) / 2, rel=2e-3)
    assert model.basis(sibling, shape.n, shape.k, shape.m) == "predicted from similar kernels measured on this layer"
    stranger = _config("hopper_64x256_c1_s5_g4_ov_fp16")
    assert model.basis(stranger, shape.n, shape.k, shape.m) == "predicted from its parameters"
    assert model.basis(_config(big), 1024, 1024, 64) == "measured on other layers only"


def test_a_kernel_measured_at_one_shape_keeps_what_that_shape_does_to_every_kernel():
    """At 4096 x 4096 x 4096 every kernel runs 40% slower than the law (a shape effect); a fourth
    kernel measured there alone cannot tell that from its own speed, so at a token count far from
    it (M = 16, beyond the layer correction's reach) it is predicted at the ratio to the base it
    was measured at, not 40% faster."""
    from gemmgen.selection.dispatch.model import TimeModel

    odd, slow = "hopper_128x128_c2_s5_g4_ov_fp16", Shape(4096, 4096, 4096)
    configs = {**_configs(), odd: _config(odd)}
    samples = [Sample(s.kernel, s.shape, s.us * (1.4 if s.shape == slow else 1.0)) for s in _law_samples(0.01)]
    base = _base(configs[odd], np.array([slow.m]), slow.n, slow.k, 132)[0][0] * 1e6
    samples.append(Sample(odd, slow, base * math.exp(0.5) * 1.4))
    model = TimeModel.fit(samples, configs, 132)
    far = Shape(16, 4096, 4096)
    far_base = _base(configs[odd], np.array([far.m]), far.n, far.k, 132)[0][0] * 1e6
    assert model.predict(configs[odd], far) / far_base == pytest.approx(math.exp(0.5) * 1.4, rel=0.05)


def test_a_measured_token_count_that_fills_whole_tiles_is_predicted_as_measured():
    """At M = 768 (6 rows of 128; 132 tiles of 128 x 192 on 4096 x 4096: one wave of 132 SMs) the
    model gives back the measurement. exp(log 768) is an ulp over 768, which once counted a 7th
    tile row and a second wave there: twice the time, at 64-203 stored (kernel, shape) pairs per
    workload, each kernel at a token count its tiles fit exactly."""
    from gemmgen.selection.dispatch.model import TimeModel

    assert np.exp(np.log(768.0)) > 768.0  # the case this is about
    name = "hopper_128x192_c2_s4_g8_fp16"
    configs = {**_configs(), name: _config(name)}
    samples = _law_samples(0.01) + [Sample(name, Shape(m, 4096, 4096), us) for m, us in ((767, 37.7), (768, 38.8),
                                                                                          (1000, 60.0))]
    model = TimeModel.fit(samples, configs, 132)
    assert model.predict(configs[name], Shape(768, 4096, 4096)) == pytest.approx(38.8, rel=0.01)
    assert model.predict_m(configs[name], 4096, 4096, np.array([767, 768]))[1] == pytest.approx(38.8, rel=0.01)
