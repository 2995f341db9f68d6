"""nn.RNN / nn.LSTM / nn.GRU on tpu against the same modules on CPU.

ATen's recurrent loops call the fused cells `_thnn_fused_lstm_cell` /
`_thnn_fused_gru_cell` (and their backward ops) on accelerators; PyTorch
implements them only for CUDA, so these run through native rules
(csrc/lowering/rnn_cells.cpp). Forward outputs, final states and every
parameter's gradient are compared with CPU, and no CPU fallback may run.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from no_fallback import native

TOL = {"rtol": 2e-5, "atol": 2e-5}


def _loss(out: torch.Tensor, state: object) -> torch.Tensor:
    states = state if isinstance(state, tuple) else (state,)
    return (out * out).sum() + sum((s * 1.5).sum() for s in states)


def _run(module: nn.Module, x: torch.Tensor, h0: object, device: str):
    m = copy.deepcopy(module).to(device)
    inp = x.detach().clone().to(device).requires_grad_(True)
    if h0 is not None:
        h0 = tuple(h.to(device) for h in h0) if isinstance(h0, tuple) else h0.to(device)
    out, state = m(inp, h0) if h0 is not None else m(inp)
    _loss(out, state).backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters()}
    states = state if isinstance(state, tuple) else (state,)
    return out.cpu(), [s.cpu() for s in states], grads, inp.grad.cpu()


def _compare(module: nn.Module, x: torch.Tensor, h0: object = None) -> None:
    ref = _run(module, x, h0, "cpu")
    with native():
        got = _run(module, x, h0, "tpu")
    torch.testing.assert_close(got[0], ref[0], **TOL)
    for g, r in zip(got[1], ref[1]):
        torch.testing.assert_close(g, r, **TOL)
    assert got[2].keys() == ref[2].keys()
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], **TOL, msg=name)
    torch.testing.assert_close(got[3], ref[3], **TOL)


@pytest.mark.parametrize(
    "kind,config",
    [
        ("RNN", {}),
        ("LSTM", {"num_layers": 2, "bidirectional": True}),
        ("GRU", {"num_layers": 2, "bidirectional": True}),
        ("LSTM", {"batch_first": True, "bias": False}),
        ("GRU", {"batch_first": True, "bias": False}),
    ],
    ids=["rnn", "lstm_2layer_bidir", "gru_2layer_bidir", "lstm_batch_first_nobias",
         "gru_batch_first_nobias"],
)
def test_rnn_forward_backward(kind: str, config: dict) -> None:
    torch.manual_seed(0)
    module = getattr(nn, kind)(5, 7, **config)
    shape = (3, 4, 5) if config.get("batch_first") else (4, 3, 5)
    _compare(module, torch.randn(*shape))


def test_lstm_proj_size_and_initial_state() -> None:
    torch.manual_seed(1)
    module = nn.LSTM(6, 8, num_layers=2, proj_size=3, bidirectional=True)
    h0 = (torch.randn(4, 2, 3), torch.randn(4, 2, 8))
    _compare(module, torch.randn(5, 2, 6), h0)


def test_gru_initial_state_relu_rnn() -> None:
    torch.manual_seed(2)
    _compare(nn.GRU(4, 6, num_layers=2), torch.randn(3, 2, 4), torch.randn(2, 2, 6))
    _compare(nn.RNN(4, 6, nonlinearity="relu"), torch.randn(3, 2, 4))


def test_unbatched_input() -> None:
    torch.manual_seed(3)
    _compare(nn.LSTM(4, 5), torch.randn(6, 4))
    _compare(nn.GRU(4, 5, bidirectional=True), torch.randn(6, 4))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_sequence(kind: str) -> None:
    torch.manual_seed(4)
    module = getattr(nn, kind)(3, 5, bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 3)
    lengths = torch.tensor([4, 3, 1])

    def run(device: str):
        m = copy.deepcopy(module).to(device)
        inp = x.detach().clone().to(device).requires_grad_(True)
        packed = pack_padded_sequence(inp, lengths, batch_first=True)
        out, state = m(packed)
        padded, _ = pad_packed_sequence(out, batch_first=True)
        _loss(padded, state).backward()
        states = state if isinstance(state, tuple) else (state,)
        return padded.cpu(), [s.cpu() for s in states], inp.grad.cpu(), [
            p.grad.cpu() for p in m.parameters()
        ]

    ref = run("cpu")
    with native():
        got = run("tpu")
    torch.testing.assert_close(got[0], ref[0], **TOL)
    for g, r in zip(got[1] + [got[2]] + got[3], ref[1] + [ref[2]] + ref[3]):
        torch.testing.assert_close(g, r, **TOL)


def test_dropout_between_layers_train_mode() -> None:
    # Dropout draws from tpu's generator (not CPU's stream): check its
    # semantics instead of values. p=0 must equal CPU; with p=1 every layer
    # after the first sees zeros, so the output is the bias-only recurrence,
    # the same for every batch element.
    torch.manual_seed(5)
    module = nn.LSTM(4, 5, num_layers=2, dropout=0.0)
    module.dropout = 0.0
    _compare(module, torch.randn(3, 2, 4))
    m = nn.LSTM(4, 5, num_layers=2, dropout=1.0).to("tpu")
    x = torch.randn(3, 2, 4, device="tpu")
    with native():
        out, _ = m(x)
    out = out.cpu()
    torch.testing.assert_close(out[:, 0], out[:, 1])
    assert not torch.allclose(out[0, 0], out[2, 0])  # still recurrent


def test_lstm_cell_modules() -> None:
    torch.manual_seed(6)
    for cell in (nn.LSTMCell(4, 5), nn.GRUCell(4, 5), nn.RNNCell(4, 5)):
        x = torch.randn(3, 4)
        ref = cell(x)
        with native():
            got = copy.deepcopy(cell).to("tpu")(x.to("tpu"))
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = got if isinstance(got, tuple) else (got,)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g.cpu(), r.detach(), **TOL)


def test_lstm_language_model_training_step() -> None:
    """An embedding + LSTM + linear LM: loss and the SGD step equal CPU's."""
    torch.manual_seed(7)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.rnn = nn.LSTM(8, 16, batch_first=True)
            self.head = nn.Linear(16, 20)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(self.emb(tokens))[0])

    model = LM()
    tokens = torch.randint(0, 20, (2, 9))

    def train(device: str) -> list[float]:
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        t = tokens.to(device)
        losses = []
        for _ in range(2):
            logits = m(t[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 20), t[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ref = train("cpu")
    with native():
        got = train("tpu")
    assert got == pytest.approx(ref, rel=1e-5)


def test_half_precision_lstm_runs_in_f32() -> None:
    torch.manual_seed(8)
    m = nn.LSTM(4, 6).to(torch.bfloat16)
    x = torch.randn(5, 2, 4, dtype=torch.bfloat16)
    ref, _ = copy.deepcopy(m).float()(x.float())
    with native():
        got, _ = m.to("tpu")(x.to("tpu"))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), ref, rtol=0.05, atol=0.03)


def test_bad_hidden_state_shape_raises() -> None:
    m = nn.GRU(4, 6).to("tpu")
    with pytest.raises(RuntimeError, match="hidden"):
        m(torch.randn(3, 2, 4, device="tpu"), torch.randn(1, 5, 6, device="tpu"))
