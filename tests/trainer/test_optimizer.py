"""trainer.optimizer: Adam fused where torch has the kernel, the same update as torch's default Adam."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import optimizer as optimizer_module
from trainer.optimizer import adam


def _parameters(seed: int, shapes: list[tuple[int, ...]]) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _train(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], seed: int, steps: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        opt.step()


def test_adam_is_fused_on_the_cpu():
    opt = adam(_parameters(0, [(3, 4)]), 0.01)
    assert opt.param_groups[0]["fused"] is True


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 6), lr=st.sampled_from([1e-4, 3e-3, 0.1]),
       weight_decay=st.sampled_from([0.0, 5e-4]),
       shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 9)), min_size=1, max_size=4))
def test_the_fused_update_is_the_default_adams(seed, steps, lr, weight_decay, shapes):
    fused, plain = _parameters(seed, shapes), _parameters(seed, shapes)
    _train(adam(fused, lr, weight_decay), fused, seed, steps)
    _train(torch.optim.Adam(plain, lr=lr, weight_decay=weight_decay), plain, seed, steps)
    for ours, reference in zip(fused, plain, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)


def test_a_device_without_a_fused_kernel_gets_the_default_adam(monkeypatch):
    class NoFusedAdam(torch.optim.Adam):
        def __init__(self, params, **kwargs):
            if kwargs.get("fused"):
                raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of "
                                   "supported devices")
            super().__init__(params, **kwargs)

    monkeypatch.setattr(optimizer_module.torch.optim, "Adam", NoFusedAdam)
    opt = adam(_parameters(0, [(3, 4)]), 0.01, 1e-4)
    assert not opt.param_groups[0]["fused"]
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["weight_decay"] == 1e-4


def test_a_resumed_optimizer_keeps_the_kernel_it_was_checkpointed_with():
    plain_params = _parameters(0, [(5, 3)])
    plain = torch.optim.Adam(plain_params, lr=0.01)  # an older run's checkpoint: the default kernel
    _train(plain, plain_params, 0, 2)
    resumed = adam(_parameters(0, [(5, 3)]), 0.01)
    resumed.load_state_dict(plain.state_dict())
    assert not resumed.param_groups[0]["fused"]
