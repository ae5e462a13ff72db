"""run.compile / run.channels_last / run.tf32 (hpcdp.train.accel) and compiled-model
checkpoints, without compiling anything (compiled training: tests/parallel/test_compile.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from hpcdp import config as cfgmod
from hpcdp.models.gpt import GPT, GPTConfig
from hpcdp.models.vision import build_model
from hpcdp.train import accel
from hpcdp.train import checkpoints as cm

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


@pytest.mark.parametrize(("setting", "convnet", "device", "want"), [
    ("auto", True, CUDA, True), ("auto", True, CPU, False), ("auto", False, CUDA, False),
    ("on", True, CPU, True), ("on", False, CPU, False), ("off", True, CUDA, False),
])
def test_channels_last_choice(setting: str, convnet: bool, device: torch.device,
                              want: bool) -> None:
    assert accel.wants_channels_last(setting, convnet, device) is want


def test_convnets_are_recognised() -> None:
    assert accel.is_convnet(build_model("digits_cnn", (1, 8, 8), 4, 0, True))
    assert not accel.is_convnet(GPT(GPTConfig(vocab_size=17, seq_len=8, layers=1, heads=2,
                                              width=16)))


def test_to_layout_changes_image_batches_only() -> None:
    x = torch.randn(2, 3, 4, 4)
    nhwc = accel.to_layout(x, True)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and torch.equal(nhwc, x)
    assert accel.to_layout(x, False) is x
    tokens = torch.zeros(2, 5, dtype=torch.long)
    assert accel.to_layout(tokens, True) is tokens


def test_channels_last_forced_on_cpu_agrees_with_eager() -> None:
    """A ResNet in NHWC (run.channels_last=on) gives the loss and gradients of NCHW."""
    torch.manual_seed(0)
    plain = build_model("resnet18", (3, 32, 32), 10, 8, True)
    nhwc = copy.deepcopy(plain)
    cfg = cfgmod.build(None, ["data.path=d", "run.channels_last=on", "model.name=resnet18"])
    assert accel.prepare_model(cfg, nhwc, CPU) is True
    convs = [m for m in nhwc.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    losses = []
    for net, inputs in ((plain, x), (nhwc, accel.to_layout(x, True))):
        loss = F.cross_entropy(net(inputs), y)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(plain.named_parameters(), nhwc.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_compile_option_compiles_in_place_with_plain_names() -> None:
    """run.compile=true: the same module, its state dict keys unchanged (compiling itself
    waits for the first forward, so nothing is compiled here)."""
    net = build_model("digits_cnn", (1, 8, 8), 4, 0, True)
    keys = list(net.state_dict())
    cfg = cfgmod.build(None, ["data.path=d", "run.compile=true",
                              "run.compile_mode=reduce-overhead"])
    assert accel.prepare_model(cfg, net, CPU) is False  # no channels_last on a CPU
    assert net._compiled_call_impl is not None
    assert list(net.state_dict()) == keys


@pytest.mark.parametrize("exported", [None, "3"])
def test_kernels_compile_with_the_ranks_threads_unless_exported(monkeypatch, exported) -> None:
    """Inductor's compile processes follow this rank's compute threads (one: in process,
    no pool of workers); an exported TORCHINDUCTOR_COMPILE_THREADS is left to torch."""
    import torch._inductor.config as inductor_config

    if exported is None:
        monkeypatch.delenv(accel.COMPILE_THREADS_VAR, raising=False)
    else:
        monkeypatch.setenv(accel.COMPILE_THREADS_VAR, exported)
    threads, before = torch.get_num_threads(), inductor_config.compile_threads
    try:
        torch.set_num_threads(1)
        inductor_config.compile_threads = 7
        accel.compile_model(build_model("digits_cnn", (1, 8, 8), 4, 0, True), "default")
        chosen = inductor_config.compile_threads
    finally:
        torch.set_num_threads(threads)
        inductor_config.compile_threads = before
    assert chosen == (1 if exported is None else 7)


def test_bad_compile_mode_is_refused() -> None:
    with pytest.raises(cfgmod.ConfigError, match="compile_mode"):
        cfgmod.build(None, ["data.path=d", "run.compile_mode=fastest"])


def test_wrapped_state_dict_loads_into_the_plain_model() -> None:
    """Weights saved from a torch.compile wrapper (`_orig_mod.` keys) pass the checkpoint
    check and load strictly into the model hpcdp builds."""
    net = build_model("digits_cnn", (1, 8, 8), 4, 0, True)
    wrapped = torch.compile(net)  # the wrapper alone: compiling waits for a call
    saved = wrapped.state_dict()
    assert all(k.startswith(accel.COMPILE_PREFIX) for k in saved)
    state = {"model_name": "digits_cnn", "model": saved}
    fresh = build_model("digits_cnn", (1, 8, 8), 4, 0, True)
    cm.check_compatible(state, fresh, "digits_cnn", "test")
    fresh.load_state_dict(accel.without_compile_prefix(saved))
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v)
    nested = accel.without_compile_prefix({"a._orig_mod.w": 1, "b": 2})
    assert nested == {"a.w": 1, "b": 2}


def test_tf32_is_a_gpu_setting_only() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    assert accel.set_tf32(True, CPU) is False
    assert torch.backends.cuda.matmul.allow_tf32 == before
