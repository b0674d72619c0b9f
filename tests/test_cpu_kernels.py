"""The compiled small-batch linear layer and RMSNorm (train/small_linear.py, train/csrc/) compute what torch's do."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train import cpu_kernels
from train.small_linear import MAX_ROWS, PackedLinears, pack_weight


@pytest.fixture(autouse=True)
def _require_kernels() -> None:
    """Fail, not skip, where the kernels were not built: the sampler would silently be slower."""
    if not cpu_kernels.available():
        pytest.fail("the compiled CPU kernels (train/cpu_kernels.py) are not available on this machine: see the "
                    "warning logged when they were built (a C++ compiler and ninja are needed)")


@pytest.mark.parametrize("features,inputs,bias", [(192, 192, False), (576, 192, True), (1276, 192, False),
                                                  (17, 33, True), (5, 8, False)])
def test_small_linear_equals_f_linear(features, inputs, bias):
    """Every row-tile size (6, 3, 1 and their mixes), a last panel cut short, with and without bias."""
    torch.manual_seed(0)
    module = torch.nn.Linear(inputs, features, bias=bias)
    if bias:
        with torch.no_grad():
            module.bias.normal_()
    linears = PackedLinears()
    for rows in (1, 2, 3, 4, 5, 6, 7, 13, 64, MAX_ROWS):
        x = torch.randn(rows, inputs)
        torch.testing.assert_close(linears.linear(module, x), F.linear(x, module.weight, module.bias),
                                   atol=2e-5, rtol=1e-5)
    batched = torch.randn(3, 2, inputs)  # leading dimensions kept
    torch.testing.assert_close(linears.linear(module, batched), F.linear(batched, module.weight, module.bias),
                               atol=2e-5, rtol=1e-5)


def test_layers_reading_one_input_project_as_one_stacked_pack():
    """Queries/keys/values or gate/up: one call over their stacked weights gives each layer's own output, biases
    where some layers have none, sizes that cut panels in the middle of a layer; an in-place change of any one of
    them repacks the stack."""
    torch.manual_seed(2)
    modules = (torch.nn.Linear(48, 40), torch.nn.Linear(48, 7, bias=False), torch.nn.Linear(48, 24))
    linears = PackedLinears()
    for rows in (1, 5, 23):
        x = torch.randn(rows, 48)
        outputs = linears.project(modules, x)
        assert [out.shape for out in outputs] == [(rows, 40), (rows, 7), (rows, 24)]
        for module, out in zip(modules, outputs):
            torch.testing.assert_close(out, F.linear(x, module.weight, module.bias), atol=2e-5, rtol=1e-5)
    with torch.no_grad():
        modules[1].weight.mul_(-3.0)
    torch.testing.assert_close(linears.project(modules, x)[1], F.linear(x, modules[1].weight), atol=2e-5, rtol=1e-5)


def test_packed_weights_follow_in_place_changes():
    """An optimizer step changes the weight in place: the next call repacks instead of using the stale pack."""
    torch.manual_seed(1)
    module, x, linears = torch.nn.Linear(40, 24), torch.randn(4, 40), PackedLinears()
    linears.linear(module, x)
    with torch.no_grad():
        module.weight.mul_(-2.0)
        module.bias.add_(1.0)
    torch.testing.assert_close(linears.linear(module, x), F.linear(x, module.weight, module.bias), atol=2e-5,
                               rtol=1e-5)


def test_pack_layout():
    """Panel p holds features 16p..16p+15 feature-minor, zeros past the last feature."""
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = pack_weight(weight)  # [2, 3, 16]
    assert packed.shape == (2, 3, 16)
    assert torch.equal(packed[1, :, 2], weight[18]) and torch.equal(packed[0, 1, :], weight[:16, 1])
    assert torch.equal(packed[1, :, 4:], torch.zeros(3, 12))


@pytest.mark.parametrize("rows,width", [(1, 192), (23, 192), (138, 32), (4000, 96), (3, 7)])
def test_rms_norm_equals_torch(rows, width):
    torch.manual_seed(2)
    x, weight = torch.randn(rows, width) * 3, torch.randn(width)
    torch.testing.assert_close(cpu_kernels.extension().rms_norm(x, weight, 1e-6),
                               torch.rms_norm(x, (width,), weight, 1e-6), atol=1e-5, rtol=1e-5)
    tiny = torch.full((2, width), 1e-4)  # eps matters where the mean square is near it
    torch.testing.assert_close(cpu_kernels.extension().rms_norm(tiny, weight, 1e-6),
                               torch.rms_norm(tiny, (width,), weight, 1e-6), atol=1e-5, rtol=1e-5)
