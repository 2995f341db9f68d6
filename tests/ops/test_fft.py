"""torch.fft, stft/istft on tpu: native (_fft_r2c / _fft_c2r / _fft_c2c on
stablehlo.fft), compared with PyTorch's CPU (pocketfft) results, with
backward, and with no CPU fallback."""
import pytest
import torch

import torch_tpu
from no_fallback import native

NORMS = [None, "forward", "ortho"]


def close(tpu, cpu, tol=2e-5):
    assert tpu.device.type == "tpu"
    assert tpu.dtype == cpu.dtype, (tpu.dtype, cpu.dtype)
    scale = max(1.0, cpu.abs().max().item()) if cpu.numel() else 1.0
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=tol, atol=tol * scale)


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g)


@pytest.mark.parametrize("name,complex_in", [("fft", True), ("ifft", True), ("rfft", False),
                                             ("irfft", True), ("hfft", True), ("ihfft", False),
                                             ("fft", False)])
def test_1d(name, complex_in):
    x = rand(3, 10, dtype=torch.complex64 if complex_in else torch.float32, seed=1)
    f = getattr(torch.fft, name)
    with native():
        for norm in NORMS:
            close(f(x.to("tpu"), norm=norm), f(x, norm=norm))
        close(f(x.to("tpu"), n=7, dim=0, norm="ortho"), f(x, n=7, dim=0, norm="ortho"))  # pad
        close(f(x.to("tpu"), n=6), f(x, n=6))                                            # trim


@pytest.mark.parametrize("name,complex_in", [("fft2", True), ("ifft2", True), ("rfft2", False),
                                             ("irfft2", True), ("hfft2", True),
                                             ("ihfft2", False)])
def test_2d(name, complex_in):
    x = rand(2, 6, 8, dtype=torch.complex64 if complex_in else torch.float32, seed=2)
    f = getattr(torch.fft, name)
    with native():
        close(f(x.to("tpu")), f(x))
        close(f(x.to("tpu"), s=(5, 4), dim=(0, 2), norm="forward"),
              f(x, s=(5, 4), dim=(0, 2), norm="forward"))


@pytest.mark.parametrize("name,complex_in", [("fftn", True), ("ifftn", True), ("rfftn", False),
                                             ("irfftn", True), ("hfftn", True),
                                             ("ihfftn", False)])
def test_nd_more_than_three_dims(name, complex_in):
    # stablehlo.fft does at most 3 dims per op: 4 dims take two.
    x = rand(3, 4, 5, 6, dtype=torch.complex64 if complex_in else torch.float32, seed=3)
    f = getattr(torch.fft, name)
    with native():
        close(f(x.to("tpu")), f(x))
        close(f(x.to("tpu"), dim=(3, 0, 1), norm="ortho"), f(x, dim=(3, 0, 1), norm="ortho"))


def test_complex128():
    x = rand(4, 9, dtype=torch.complex128, seed=4)
    r = rand(4, 9, dtype=torch.float64, seed=5)
    with native():
        close(torch.fft.fft2(x.to("tpu")), torch.fft.fft2(x), 1e-12)
        close(torch.fft.rfft(r.to("tpu")), torch.fft.rfft(r), 1e-12)
        close(torch.fft.irfft(x.to("tpu")), torch.fft.irfft(x), 1e-12)


def test_shift_and_freq_helpers():
    x = rand(5, 8, seed=6)
    with native():
        close(torch.fft.fftshift(x.to("tpu")), torch.fft.fftshift(x))
        close(torch.fft.ifftshift(x.to("tpu"), dim=1), torch.fft.ifftshift(x, dim=1))
        close(torch.fft.fftfreq(8, device="tpu"), torch.fft.fftfreq(8))
        close(torch.fft.rfftfreq(9, d=0.5, device="tpu"), torch.fft.rfftfreq(9, d=0.5))


@pytest.mark.parametrize("name,complex_in", [("fft", True), ("rfft", False), ("irfft", True),
                                             ("ifft2", True), ("rfftn", False),
                                             ("hfft", True)])
def test_backward(name, complex_in):
    x = rand(4, 6, dtype=torch.complex64 if complex_in else torch.float32, seed=7)
    f = getattr(torch.fft, name)

    def loss(x):
        y = f(x, norm="ortho")
        y = torch.view_as_real(y) if y.is_complex() else y
        return (y * torch.linspace(-1, 1, y.numel(), device=y.device).reshape(y.shape)).sum()

    xc = x.clone().requires_grad_()
    loss(xc).backward()
    xt = x.to("tpu").requires_grad_()
    with native():
        loss(xt).backward()
    close(xt.grad, xc.grad, 1e-4)


def test_fft_convolution_matches_direct_convolution():
    """Linear convolution through rfft * rfft -> irfft, vs CPU and vs conv1d."""
    sig, ker = rand(4, 100, seed=8), rand(4, 17, seed=9)
    n = sig.shape[-1] + ker.shape[-1] - 1

    def fft_conv(s, k):
        return torch.fft.irfft(torch.fft.rfft(s, n=n) * torch.fft.rfft(k, n=n), n=n)

    with native():
        out = fft_conv(sig.to("tpu"), ker.to("tpu"))
    close(out, fft_conv(sig, ker), 1e-4)
    direct = torch.stack([torch.nn.functional.conv1d(sig[i].view(1, 1, -1),
                                                     ker[i].flip(0).view(1, 1, -1),
                                                     padding=ker.shape[-1] - 1)[0, 0]
                          for i in range(4)])
    torch.testing.assert_close(out.cpu(), direct, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window_fn", [torch.hann_window, torch.hamming_window, torch.ones])
@pytest.mark.parametrize("center", [True, False])
def test_stft_spectrogram(window_fn, center):
    audio = rand(2, 800, seed=10)
    n_fft, hop = 64, 16

    def spectrogram(a):
        window = window_fn(n_fft, device=a.device)
        spec = torch.stft(a, n_fft, hop_length=hop, window=window, center=center,
                          return_complex=True)
        return spec.abs() ** 2

    with native():
        out = spectrogram(audio.to("tpu"))
    close(out, spectrogram(audio), 1e-4)


def test_stft_istft_round_trip_and_backward():
    audio = rand(2, 640, seed=11)
    n_fft, hop = 64, 16

    def round_trip(a):
        window = torch.hann_window(n_fft, device=a.device)
        spec = torch.stft(a, n_fft, hop_length=hop, window=window, return_complex=True)
        return torch.istft(spec * 0.5, n_fft, hop_length=hop, window=window,
                           length=a.shape[-1])

    ac = audio.clone().requires_grad_()
    ref = round_trip(ac)
    (ref ** 2).sum().backward()
    at = audio.to("tpu").requires_grad_()
    with native():
        out = round_trip(at)
        (out ** 2).sum().backward()
    close(out, ref, 1e-4)
    torch.testing.assert_close(out.detach().cpu(), audio * 0.5, rtol=1e-4, atol=1e-4)
    close(at.grad, ac.grad, 1e-4)
