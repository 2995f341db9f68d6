"""A first call with a new size: compiles and wall time, exact shapes vs
bounded dynamic shapes (TORCH_TPU_DYNAMIC_SHAPES=0 and auto, each in a child
process with its own empty disk cache), next to CPU eager's time for the same
call, plus the warm call (the cost of padding at the executable boundary).

The workload is a strict-eager MLP block over a (batch, seq, hidden) tensor
(linear, gelu, linear, residual add, softmax, mean): warmed with sequence
lengths 33 and 34 (under auto the first compiles static, the second the
bucket of sizes 33..36), then timed at new lengths inside that bucket, and at
one past it (the next bucket: 37..40). Mode "0+mark": exact shapes, but the
input marked torch_tpu.mark_dynamic(x, 1, 2, 64): every length up to 64 runs
on one executable per op, from the first call.

A second scenario: a tiny 2-layer Llama (hidden 64, random weights, no hub)
greedy-generating 8 tokens (DynamicCache) from prompts of new lengths after
warm-up prompts of lengths 33, 34 and 38, then from batches of new sizes after
warm-up batches of 4 and 5 (then the same in fused eager, and with StaticCache,
whose decode step generate() compiles with torch.compile): compiles and wall time of each new shape, CPU
eager's time for the same generate(), whether the tokens equal CPU's, the
repeat call of the same prompt (warm: nothing compiles; what the padding
costs) and the decode loop's peak device memory above the weights, each
next to the exact-shape run's.

A third: a training step of the same Llama (forward with the loss, backward,
AdamW) on batches of 4 whose padded length changes from step to step (as
with DataCollatorWithPadding), warmed at lengths 12 and 14 (the 16-bucket),
then new lengths 13, 15, 11: compiles and wall time of the step next to CPU
eager's step, the warm step, and whether the loss equals CPU's.

A fourth: a small CNN's training step (conv, batch norm, group norm, max
pool, upsample, adaptive pool, linear; SGD with momentum) on 3x32x32 images,
warmed at batch sizes 8 and 6 (the 8-bucket), then the ragged last batches
5, 7, 3 (a DataLoader without drop_last).

A fifth: a tiny Diffusers UNet2DConditionModel (cross-attention) forward and
AutoencoderKL decode on 1 latent of 4 channels, warmed at latent sides 32 and
40 (the 40-bucket: 37..40), then new sides 38 (inside it), 34 (the 36-bucket,
new) and 36 (inside that one).

A sixth: a tiny BERT's sequence-classification training step with Hugging
Face's default dropout (0.1 on hidden states and attention probabilities),
batch 8, one row padded, warmed at lengths 12 and 14, then 13, 15, 11. Its
random draws differ from CPU's stream, so its loss is compared with the
exact-shape child's (the same seeds draw the same masks at any padded size).

    PYTHONPATH=python python3 benchmarks/new_shapes.py [--dynamic | --fused | --static | --training | --cnn | --diffusers | --dropout]

CPU eager runs with one thread (NEW_SHAPES_CPU_THREADS to change it): on a
shared machine its multi-threaded times swing by 100x.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

HIDDEN, BATCH = 64, 2
WARM = (33, 34)   # the 36-bucket (dynamic.cpp: 8 buckets per octave)
NEW = (35, 36)    # new sizes inside it
PAST = (37,)      # a size past it (bucket 40)


def block(x, w1, w2):
    import torch
    import torch.nn.functional as F
    h = F.gelu(F.linear(x, w1))
    y = F.linear(h, w2) + x
    return torch.softmax(y, -1).mean(-1)


def child():
    import torch
    import torch_tpu
    from torch_tpu import debug
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))  # steady CPU times
    w1, w2 = torch.randn(4 * HIDDEN, HIDDEN) / 8, torch.randn(HIDDEN, 4 * HIDDEN) / 16
    dw1, dw2 = w1.to("tpu"), w2.to("tpu")

    mark = os.environ.get("NEW_SHAPES_MARK") == "1"

    def tpu_call(n):
        x = torch.randn(BATCH, n, HIDDEN)
        debug.reset_stats()
        t = time.perf_counter()
        dx = x.to("tpu")
        if mark:  # one executable per op for every length up to 64
            torch_tpu.mark_dynamic(dx, 1, 2, 64)
        out = block(dx, dw1, dw2).cpu()
        dt = time.perf_counter() - t
        s = debug.stats()
        err = (out - block(x, w1, w2)).abs().max().item()
        return {"n": n, "seconds": dt, "compiles": s["compiles"], "dynamic_hits": s["dynamic_hits"],
                "max_err": err}

    def cpu_call(n):  # the median of 5 (the first call of a size included)
        x = torch.randn(BATCH, n + 100, HIDDEN)[:, :n]  # a size CPU has not run either
        times = []
        for _ in range(5):
            t = time.perf_counter()
            block(x, w1, w2)
            times.append(time.perf_counter() - t)
        return sorted(times)[2]

    for n in WARM:
        tpu_call(n)
    rows = []
    for n in NEW + PAST:
        first = tpu_call(n)
        first["warm_seconds"] = sorted(tpu_call(n)["seconds"] for _ in range(3))[1]
        first["cpu_seconds"] = cpu_call(n)
        rows.append(first)
    print(json.dumps(rows))


LLAMA_WARM = (33, 34, 38)  # 38: the KV cache reaches 45 (bucket 48)
LLAMA_NEW = (35, 36, 37)   # new prompt lengths inside the warm buckets
BATCH_WARM = (4, 5)        # batch 5 makes the batch dim dynamic (bucket 16)
BATCH_NEW = (3, 6, 7)      # new batch sizes (prompt length 34)
# --wide: the same Llama 16x wider (hidden 1024, vocab 32000), whose MLP
# activations pad by more than the 1 MiB a tensor may (fine small buckets).
WIDE_LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=8,
                  vocab_size=32000)


def child_llama():
    import torch
    import torch_tpu
    from _tiny_llama import greedy_pair
    from torch_tpu import compile as tpu_compile, debug
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))
    cpu, dev = greedy_pair(**(WIDE_LLAMA if os.environ.get("NEW_SHAPES_WIDE") else {}))

    static = os.environ.get("NEW_SHAPES_CACHE") == "static"
    kw = {"cache_implementation": "static"} if static else {}  # static: generate() compiles its decode step
    fused = os.environ.get("NEW_SHAPES_CACHE") == "fused"  # DynamicCache, tpu under torch_tpu.fused()

    def gen(model, ids):
        mode = torch_tpu.fused() if fused and model is dev else contextlib.nullcontext()
        with torch.no_grad(), mode:
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                  **kw)

    rows = []
    shapes = [(1, n, n in LLAMA_NEW) for n in LLAMA_WARM + LLAMA_NEW]
    shapes += [(b, 34, b in BATCH_NEW) for b in BATCH_WARM + BATCH_NEW]
    for b, n, report in shapes:
        ids = torch.randint(2, 256, (b, n), generator=torch.Generator().manual_seed(n + 100 * b))
        t = time.perf_counter()
        expected = gen(cpu, ids)
        cpu_s = time.perf_counter() - t
        debug.reset_stats()
        tpu_compile.reset_stats()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        t = time.perf_counter()
        got = gen(dev, ids.to("tpu")).cpu()
        dt = time.perf_counter() - t
        s = debug.stats()
        peak = torch.tpu.max_memory_allocated() - base  # the decode loop's own bytes, weights excluded
        if report:
            warm = []  # the same prompt again: nothing compiles, the padding cost alone
            for _ in range(3):
                t = time.perf_counter()
                gen(dev, ids.to("tpu")).cpu()
                warm.append(time.perf_counter() - t)
            compiles = s["compiles"] + tpu_compile.stats()["graphs"]  # ops, and graphs torch.compile made
            rows.append({"b": b, "n": n, "seconds": dt, "compiles": compiles, "cpu_seconds": cpu_s,
                         "warm_seconds": min(warm), "peak_bytes": peak,
                         "equal": bool(torch.equal(got, expected))})
    print(json.dumps(rows))


def run_child(mode, scenario, cache="dynamic", wide=False):
    env = dict(os.environ, TORCH_TPU_DYNAMIC_SHAPES=mode.split("+")[0], NEW_SHAPES_MARK=str(int("+mark" in mode)),
               TORCH_TPU_CACHE_DIR=tempfile.mkdtemp(prefix="new_shapes_"), NEW_SHAPES_CACHE=cache,
               NEW_SHAPES_WIDE="1" if wide else "")
    out = subprocess.run([sys.executable, __file__, scenario], env=env, capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    return json.loads(out)


def main():
    if "--child" in sys.argv:
        return child()
    if "--child-llama" in sys.argv:
        return child_llama()
    if "--child-train" in sys.argv:
        return child_train()
    if "--child-cnn" in sys.argv:
        return child_cnn()
    if "--child-diffusers" in sys.argv:
        return child_diffusers()
    if "--child-bert-dropout" in sys.argv:
        return child_bert_dropout()
    if "--dropout" in sys.argv:  # the BERT training-with-dropout scenario alone
        return print_training("--child-bert-dropout")
    if "--diffusers" in sys.argv:  # the Diffusers new-resolution scenario alone
        return print_training("--child-diffusers")
    if "--cnn" in sys.argv:  # the CNN ragged-batch scenario alone
        return print_training("--child-cnn")
    if "--training" in sys.argv:  # the training scenario alone
        return print_training()
    if "--fused" in sys.argv:  # the Llama scenario in fused eager alone
        return print_llama("fused")
    if "--dynamic" in sys.argv:  # the Llama scenario with a DynamicCache alone
        return print_llama("dynamic")
    if "--static" in sys.argv:  # the Llama scenario with a StaticCache alone
        return print_llama("static")
    if "--wide" in sys.argv:  # the DynamicCache scenario with a 16x wider Llama alone
        return print_llama("dynamic", wide=True)
    print(f"MLP block, batch {BATCH}, hidden {HIDDEN}; warmed at seq {WARM}; new sizes {NEW}, past {PAST}")
    print(f"{'mode':>6} {'seq':>4} {'compiles':>8} {'first s':>8} {'cpu s':>8} {'ratio':>7} {'warm s':>8} {'max err':>8}")
    for mode in ("0", "auto", "0+mark"):
        for r in run_child(mode, "--child"):
            print(f"{mode:>6} {r['n']:>4} {r['compiles']:>8} {r['seconds']:>8.4f} {r['cpu_seconds']:>8.4f} "
                  f"{r['seconds'] / r['cpu_seconds']:>6.1f}x {r['warm_seconds']:>8.4f} {r['max_err']:>8.1e}")
    for cache in ("dynamic", "fused", "static"):
        print_llama(cache)
    print_llama("dynamic", wide=True)
    print_training()
    print_training("--child-cnn")
    print_training("--child-diffusers")
    print_training("--child-bert-dropout")


def print_llama(cache, wide=False):
    what = {"dynamic": "DynamicCache", "fused": "DynamicCache, fused eager: torch_tpu.fused()",
            "static": "StaticCache, decode step compiled by generate()"}[cache]
    size = "hidden 1024, vocab 32000" if wide else "hidden 64"
    print(f"\ntiny Llama (2 layers, {size}) generate 8 tokens ({what}); batch 1 warmed at prompt "
          f"lengths {LLAMA_WARM}, then prompt length 34 warmed at batch sizes {BATCH_WARM}; compiles: "
          f"op executables + torch.compile graphs")
    print(f"{'mode':>5} {'b':>3} {'len':>4} {'compiles':>8} {'first s':>8} {'cpu s':>8} {'ratio':>7} {'warm s':>8} "
          f"{'peak KiB':>9} {'tokens':>8}")
    results = {mode: run_child(mode, "--child-llama", cache, wide) for mode in ("0", "auto")}
    for mode, rows in results.items():
        for r, exact in zip(rows, results["0"]):
            print(f"{mode:>5} {r['b']:>3} {r['n']:>4} {r['compiles']:>8} {r['seconds']:>8.3f} {r['cpu_seconds']:>8.3f} "
                  f"{r['seconds'] / r['cpu_seconds']:>6.1f}x {r['warm_seconds']:>8.3f} "
                  f"{r['peak_bytes'] / 1024:>9.1f} {'equal' if r['equal'] else 'DIFFER':>8}"
                  + (f"  warm {r['warm_seconds'] / exact['warm_seconds']:.2f}x, peak "
                     f"{r['peak_bytes'] / exact['peak_bytes']:.2f}x of exact" if mode != "0" else ""))


TRAIN_WARM = (12, 14)    # the 16-bucket: the second length makes it dynamic
TRAIN_NEW = (13, 15, 11)  # new padded lengths inside it


def _train_rows(cpu, dev, step, warm, new, batch, err=lambda got, want: abs(got - want)):
    """Per size in `new` (after `warm`): compiles and time of the first tpu step,
    CPU eager's step, the best of 3 warm tpu steps, and err(tpu result, CPU's).
    `step(model, inputs)` returns the loss; `batch(n)` the CPU inputs of size n."""
    from torch_tpu import debug

    def timed(model, xs):
        t = time.perf_counter()
        loss = step(model, xs)
        return loss, time.perf_counter() - t

    rows = []
    for n in warm + new:
        xs = batch(n)
        want, cpu_s = timed(cpu, xs)
        debug.reset_stats()
        got, dt = timed(dev, [x.to("tpu") for x in xs])
        compiles = debug.stats()["compiles"]
        if n in new:
            warm_s = min(timed(dev, [x.to("tpu") for x in xs])[1] for _ in range(3))
            for _ in range(3):
                step(cpu, xs)  # the CPU model takes the same steps
            rows.append({"n": n, "seconds": dt, "compiles": compiles, "cpu_seconds": cpu_s, "warm_seconds": warm_s,
                         "loss_err": err(got, want), "loss": got if isinstance(got, float) else None})
    return rows


def child_train():
    import copy

    import torch
    import transformers as tf
    import torch_tpu  # noqa: F401
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cpu = tf.LlamaForCausalLM(cfg)
    dev = copy.deepcopy(cpu).to("tpu")
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, dev)}

    def step(model, xs):
        model.zero_grad()
        loss = model(xs[0], labels=xs[0]).loss
        loss.backward()
        opts[model].step()
        return loss.item()

    def batch(n):
        return [torch.randint(2, 256, (4, n), generator=torch.Generator().manual_seed(n))]

    print(json.dumps(_train_rows(cpu, dev, step, TRAIN_WARM, TRAIN_NEW, batch)))


def child_bert_dropout():
    import copy

    import torch
    import transformers as tf
    import torch_tpu  # noqa: F401
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128)  # dropout 0.1
    cpu = tf.BertForSequenceClassification(cfg)
    dev = copy.deepcopy(cpu).to("tpu")
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, dev)}

    def step(model, xs):
        model.zero_grad()
        loss = model(input_ids=xs[0], attention_mask=xs[1], labels=xs[2]).loss
        loss.backward()
        opts[model].step()
        return loss.item()

    def batch(n):
        g = torch.Generator().manual_seed(n)
        mask = torch.ones(8, n, dtype=torch.long)
        mask[0, -3:] = 0
        return [torch.randint(2, 256, (8, n), generator=g), mask, torch.randint(0, 2, (8,), generator=g)]

    print(json.dumps(_train_rows(cpu, dev, step, TRAIN_WARM, TRAIN_NEW, batch)))


CNN_WARM = (8, 6)     # the 8-bucket: the second batch size makes it dynamic
CNN_NEW = (5, 7, 3)   # a ragged last batch inside it


def child_cnn():
    import copy

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_tpu  # noqa: F401
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))
    torch.manual_seed(0)

    class Cnn(nn.Module):  # conv-BN-ReLU-maxpool, conv-GroupNorm-SiLU, upsample, avg pool, linear
        def __init__(self):
            super().__init__()
            self.c1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
            self.c2, self.gn = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(8, 32)
            self.c3, self.head = nn.Conv2d(32, 16, 3, padding=1), nn.Linear(16, 10)

        def forward(self, x):
            h = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
            h = F.interpolate(F.silu(self.gn(self.c2(h))), scale_factor=2)
            return self.head(F.adaptive_avg_pool2d(self.c3(h), 1).flatten(1))

    cpu = Cnn()
    dev = copy.deepcopy(cpu).to("tpu")
    opts = {m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (cpu, dev)}

    def step(model, xs):
        model.zero_grad()
        loss = F.cross_entropy(model(xs[0]), xs[1])
        loss.backward()
        opts[model].step()
        return loss.item()

    def batch(b):
        g = torch.Generator().manual_seed(b)
        return [torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g)]

    print(json.dumps(_train_rows(cpu, dev, step, CNN_WARM, CNN_NEW, batch)))


DIFF_WARM = (32, 40)        # latent sides: the second makes the spatial dims dynamic (bucket 40)
DIFF_NEW = (38, 34, 36)     # inside the 40-bucket; a new bucket (36); inside it


def child_diffusers():
    import copy

    import diffusers
    import torch
    import torch_tpu  # noqa: F401
    torch.set_num_threads(int(os.environ.get("NEW_SHAPES_CPU_THREADS", "1")))
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8).eval()
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(32, 64), layers_per_block=1,
        latent_channels=4, norm_num_groups=8).eval()
    cpu = (unet, vae)
    dev = tuple(copy.deepcopy(m).to("tpu") for m in cpu)

    def step(model, xs):
        with torch.no_grad():
            latents = model[0](xs[0], xs[1], encoder_hidden_states=xs[2]).sample
            return model[1].decode(latents).sample.cpu()

    def batch(side):
        g = torch.Generator().manual_seed(side)
        return [torch.randn(1, 4, side, side, generator=g), torch.tensor([10]), torch.randn(1, 7, 32, generator=g)]

    print(json.dumps(_train_rows(cpu, dev, step, DIFF_WARM, DIFF_NEW, batch,
                                 err=lambda got, want: (got - want).abs().max().item())))


def print_training(scenario="--child-train"):
    if scenario == "--child-diffusers":
        print(f"\nDiffusers UNet2DConditionModel forward + AutoencoderKL decode, 1 latent, warmed at latent sides "
              f"{DIFF_WARM} (err: max |image - CPU's|)")
    elif scenario == "--child-cnn":
        print(f"\nCNN training step (conv, batch norm, group norm, pools, upsample; SGD), 3x32x32 images, "
              f"warmed at batch sizes {CNN_WARM}")
    elif scenario == "--child-bert-dropout":
        print(f"\ntiny BERT training step with dropout 0.1 (AdamW), batch 8, warmed at padded lengths {TRAIN_WARM} "
              f"(loss err: |loss - the exact-shape run's|; CPU's random stream differs)")
    else:
        print(f"\ntiny Llama training step (loss, backward, AdamW), batch 4, warmed at padded lengths {TRAIN_WARM}")
    print(f"{'mode':>5} {'size':>4} {'compiles':>8} {'first s':>8} {'cpu s':>8} {'ratio':>7} {'warm s':>8} "
          f"{'loss err':>9}")
    results = {mode: run_child(mode, scenario) for mode in ("0", "auto")}
    for mode, rows in results.items():
        for r, exact in zip(rows, results["0"]):
            err = abs(r["loss"] - exact["loss"]) if scenario == "--child-bert-dropout" else r["loss_err"]
            print(f"{mode:>5} {r['n']:>4} {r['compiles']:>8} {r['seconds']:>8.3f} {r['cpu_seconds']:>8.3f} "
                  f"{r['seconds'] / r['cpu_seconds']:>6.1f}x {r['warm_seconds']:>8.3f} {err:>9.1e}"
                  + (f"  warm {r['warm_seconds'] / exact['warm_seconds']:.2f}x of exact" if mode != "0" else ""))


if __name__ == "__main__":
    main()
