"""Demo: train a small classifier on "tpu" and on CPU side by side.

Runs the same program on both devices from the same initial weights and
data, prints the losses next to each other, the inference accuracy, and
torch_tpu.debug.report() (compiles, cache hits, native ops, CPU fallbacks).
"""
import time

import torch
import torch.nn as nn

import torch_tpu


def make_data(n: int = 512, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(n, generator=g) * 3.14159
    labels = torch.randint(0, 2, (n,), generator=g)
    r = 1.0 + 0.1 * torch.randn(n, generator=g)
    x = torch.stack([r * torch.cos(angles), r * torch.sin(angles)], dim=1)
    x[labels == 1] = torch.stack([1 - x[labels == 1, 0], 0.5 - x[labels == 1, 1]], dim=1)
    return x, labels


def make_model():
    return nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))


def train(device: str, init_state, x, y, steps: int):
    model = make_model()
    model.load_state_dict(init_state)
    model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    return losses, accuracy, seconds, model


def main() -> None:
    torch.manual_seed(0)
    init_state = make_model().state_dict()
    x, y = make_data()
    steps = 60
    torch_tpu.debug.reset_stats()
    tpu_losses, tpu_acc, tpu_s, tpu_model = train("tpu", init_state, x, y, steps)
    cpu_losses, cpu_acc, cpu_s, cpu_model = train("cpu", init_state, x, y, steps)

    print(f"torch_tpu demo on tpu ({torch.tpu.get_platform()} plugin, "
          f"{torch.tpu.get_device_name()})\n")
    print(f"{'step':>5} {'loss on tpu':>14} {'loss on cpu':>14} {'|diff|':>10}")
    for i in list(range(0, steps, 10)) + [steps - 1]:
        print(f"{i:>5} {tpu_losses[i]:>14.6f} {cpu_losses[i]:>14.6f} "
              f"{abs(tpu_losses[i] - cpu_losses[i]):>10.2e}")
    max_param_diff = max(
        (a.detach().cpu() - b.detach()).abs().max().item()
        for a, b in zip(tpu_model.parameters(), cpu_model.parameters())
    )
    print(f"\naccuracy: tpu {tpu_acc:.3f}, cpu {cpu_acc:.3f}")
    print(f"largest parameter difference after {steps} steps: {max_param_diff:.2e}")
    print(f"training time: tpu {tpu_s:.2f} s (includes compiles), cpu {cpu_s:.2f} s\n")
    torch_tpu.debug.report()


if __name__ == "__main__":
    main()
