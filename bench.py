"""
Times full training steps (forward, backward, optimizer step) of BERT and CrossBERT
with the same encoder, on synthetic tokens, and compares them with the analytic FLOPs.

    python bench.py                                   # mid-size: 8 layers x 512, 256 tokens, compiled
    python bench.py --batch_size=64 --n_layer=12 --n_head=12 --n_embd=768 --block_size=512   # a GPU

Throughput counts sequence positions covered per second (rows x views x block_size),
so CMS, which turns one row into several views, neither inflates nor deflates it.
The last line printed is one JSON object, for scripts.
"""
import json
import sys
import time
from contextlib import nullcontext

import torch

from configurator import configure
from flops import flops_per_position, peak_flops, training_flops
from masking import make_views, view_shape
from model import MODELS, ModelConfig

settings = dict(
    n_layer=8, n_head=8, n_embd=512, block_size=256,
    batch_size=8,           # input rows per step (CrossBERT's CMS makes 2 views of each)
    steps=3, warmup=3,      # timed steps, after untimed ones (compilation and first-touch allocation happen there)
    device="cuda" if torch.cuda.is_available() else "cpu",
    dtype="bfloat16" if torch.cuda.is_available() else "float32",
    compile=True,
    seed=0,
)


def bench(model_type, s, device, autocast):
    torch.manual_seed(s["seed"])
    model = MODELS[model_type](ModelConfig(n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"],
                                           block_size=s["block_size"])).to(device)
    cfg = model.config
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device.type)
    step_fn = torch.compile(model) if s["compile"] else model
    B, T = s["batch_size"], s["block_size"]
    x = torch.randint(0, 50257, (B, T), device=device)
    gen = torch.Generator(device).manual_seed(s["seed"])

    def step():
        views = make_views(B, T, cfg.mask_ratio, cfg.cms, generator=gen)
        with autocast:
            _, loss = step_fn(x, views)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(s["warmup"]):
        step()
    loss = step()
    loss.item()  # wait for the device before starting the clock
    t0 = time.perf_counter()
    for _ in range(s["steps"]):
        loss = step()
    loss.item()
    dt = (time.perf_counter() - t0) / s["steps"]
    V, _, _ = view_shape(T, cfg.mask_ratio, cfg.cms)
    return cfg, B * V * T / dt, training_flops(cfg, model_type, B) / dt


def main():
    s = configure(settings, sys.argv[1:])
    device = torch.device(s["device"])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[s["dtype"]]
    autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    peak = peak_flops(device, dtype)
    print(f"device {device}, {s['dtype']}, compile={s['compile']}, peak {peak / 1e12:.2f} TFLOP/s"
          f"{' (measured with a matmul)' if device.type == 'cpu' else ''}")
    result = {}
    for model_type in ("bert", "crossbert"):
        cfg, tokens_per_s, flops_per_s = bench(model_type, s, device, autocast)
        result[model_type] = (cfg, tokens_per_s)
        print(f"{model_type:9s} mask {cfg.mask_ratio} cms={cfg.cms}: {tokens_per_s:9.0f} positions/s, "
              f"{flops_per_s / 1e12:.3f} TFLOP/s, MFU {100 * flops_per_s / peak:.1f}%")
    (bert_cfg, bert_tps), (cross_cfg, cross_tps) = result["bert"], result["crossbert"]
    flops_ratio = flops_per_position(bert_cfg, "bert") / flops_per_position(cross_cfg, "crossbert")
    print(f"CrossBERT / BERT throughput {cross_tps / bert_tps:.2f}x; analytic FLOPs per position BERT / CrossBERT {flops_ratio:.2f}x")
    print(json.dumps({"bert_tokens_per_s": round(bert_tps, 1), "crossbert_tokens_per_s": round(cross_tps, 1),
                      "speedup": round(cross_tps / bert_tps, 3), "flops_ratio": round(flops_ratio, 3), **s}))


if __name__ == "__main__":
    main()
