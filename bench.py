"""
Times full training steps (forward, backward, optimizer step) of BERT, CrossBERT and ELECTRA with the same encoder, on
synthetic tokens, against the analytic FLOPs (flops.py). bf16 autocast where the device computes it natively, as
train.py; the last line printed is one JSON object, for scripts.

    python bench.py                                   # mid-size: 8 layers x 512, 256 tokens, compiled
    python bench.py --batch_size=64 --n_layer=12 --n_head=12 --n_embd=768 --block_size=512 --flash_check   # a GPU
    python bench.py --n_layer=2 --n_head=2 --n_embd=128 --block_size=128 --batch_size=12 --vocab_size=8192 --profile
                                                      # the default run's shape and micro-step, and its top ops
    python bench.py --mask_ratio=0.75 --cms=False     # every model at 75% masking, one view (BERT's speedup baseline)
    python bench.py --n_layer=12 --n_head=12 --n_embd=768 --block_size=512 --batch_size=2 --design
                                                      # flops.py's design table measured

Two throughputs, named for what they count: input tokens/s (rows x block_size, unique data) and view positions/s (rows
x views x block_size, what complementary masking multiplies; the paper's tokens/s).
"""
import json
import sys
from contextlib import nullcontext

import torch

from configurator import UserError, configure, make_config, user_errors
from plumbing.checks import at_least, check_device
from flops import design, flops_per_position
from plumbing.throughput import checked_peak, fastest_dtype, peak_flops, peak_from_table, time_steps
from model import MODELS

settings = dict(
    n_layer=8, n_head=8, n_embd=512, block_size=256,  # the shape of the three models (ModelConfig's settings)
    vocab_size=0,           # 0: GPT-2's 50,304 ids; a compact vocabulary of that many ids (train.py's default: 8,192)
    gen_width=0.25,         # ELECTRA's generator width, a fraction of n_embd (rounded to whole heads)
    mask_ratio=None,        # every model's mask ratio; None: each one's default (BERT 0.2, CrossBERT 0.5, ELECTRA 0.15)
    cms=None,               # every model's complementary masking; None: each model's default (CrossBERT's alone)
    batch_size=8,           # input rows per step (CrossBERT's CMS makes 2 views of each)
    steps=3,                # timed steps, after the warmup steps
    warmup=3,               # untimed steps first: compilation and first-touch allocation happen there
    device="cuda" if torch.cuda.is_available() else "cpu",  # cpu, cuda or cuda:N
    dtype=fastest_dtype("cuda" if torch.cuda.is_available() else "cpu"),  # float32, or bfloat16 autocast
    compile=True,           # torch.compile the models, as train.py does
    flash_check=False,      # CUDA: fail unless FlashAttention serves training and encode()
    profile=False,          # print the top ops by self time of each model's step
    design=False,           # time flops.py's design rows instead: BERT and CrossBERT at 0.5, 0.667, 0.75, CMS on/off
    seed=0,                 # the weights, tokens and views
)


def main(argv):
    s = configure(settings, argv, dict(mask_ratio=float, cms=bool), help_from=[__file__])
    at_least(s, 1, ("batch_size", "steps"))
    check_device(s["device"], s["dtype"])
    device = torch.device(s["device"])
    if s["flash_check"] and device.type != "cuda":
        raise UserError("--flash_check needs a CUDA device: FlashAttention is a GPU kernel")
    if s["design"] and (s["mask_ratio"] is not None or s["cms"] is not None):
        raise UserError("--design varies mask_ratio and cms itself; give it the shape alone")
    for model_type in MODELS:  # a shape no model can have stops here, before anything runs (ModelConfig's checks)
        try:
            make_config({**s, "model_type": model_type})
        except ValueError as e:
            raise UserError(str(e)) from None
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[s["dtype"]]
    autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    if s["profile"] and s["compile"] and device.type == "cpu":
        torch._inductor.config.cpp.enable_kernel_profile = True  # name each fused C++ kernel in the profile
    peak = peak_flops(device, dtype)
    print(f"device {device}, {s['dtype']}, compile={s['compile']}, peak {peak / 1e12:.2f} TFLOP/s "
          f"({'its datasheet' if peak_from_table(device, dtype) else 'the best of 10 matmuls'})")
    if s["design"]:
        return measure_design(s, device, dtype, autocast, peak)
    out, flops_per_pos = {}, {}
    for model_type in MODELS:
        r = time_steps(model_type, s, device, autocast)
        peak = checked_peak(peak, r["flops_per_s"], lambda: peak_flops(device, dtype))  # MFU stays <= 100%
        cfg = r["config"]
        flops_per_pos[model_type] = flops_per_position(cfg, model_type)
        out.update({f"{model_type}_input_tokens_per_s": round(r["input_tokens_per_s"], 1),
                    f"{model_type}_view_positions_per_s": round(r["view_positions_per_s"], 1),
                    f"{model_type}_mfu": round(r["flops_per_s"] / peak, 4)})
        memory = f", peak memory {r['peak_memory'] / 2**30:.1f} GiB" if r["peak_memory"] else ""
        print(f"{model_type:9s} mask {cfg.mask_ratio} cms={cfg.cms}: {r['input_tokens_per_s']:9.0f} input tokens/s, "
              f"{r['view_positions_per_s']:9.0f} view positions/s, {r['flops_per_s'] / 1e12:.3f} TFLOP/s, "
              f"MFU {100 * r['flops_per_s'] / peak:.1f}%{memory}")
        if r.get("flash", True) is not True:
            raise UserError(f"--flash_check: FlashAttention cannot serve {model_type}: {r['flash']}")
    # each model against BERT, per view position (a view position is an input token for one-view models): measured
    # speed, and the analytic FLOP ratio that would explain it
    for m in MODELS:
        if m != "bert":
            out[f"{m}_speedup"] = round(out[f"{m}_view_positions_per_s"] / out["bert_view_positions_per_s"], 3)
            out[f"{m}_flops_ratio"] = round(flops_per_pos["bert"] / flops_per_pos[m], 3)
            print(f"{m} / bert view positions/s {out[f'{m}_speedup']:.2f}x; analytic FLOPs per view position "
                  f"bert / {m} {out[f'{m}_flops_ratio']:.2f}x")
    if s["flash_check"]:
        print("flash served every attention")
    print(json.dumps({**out, **s}))


def measure_design(s, device, dtype, autocast, peak):
    """flops.design's rows timed: each row's input tokens/s and view positions/s as multiples of BERT at its default
    ratio measured at the same block (a CMS row whose views need a shorter block gets a BERT of that block), beside the
    multiples the analytic count predicts at equal FLOP/s. A row slower than its count spends its time outside the
    counted matmuls (attention's softmax, the loss, gathers: a small model's overhead)."""
    reference = {}  # block size -> the reference BERT's input tokens/s there
    rows = []
    print("| model | mask ratio | CMS | block | input tokens/s | vs BERT, measured / counted | "
          "view positions/s vs BERT, measured / counted | MFU |\n" + "|---" * 8 + "|")
    for i, r in enumerate(design(make_config({**s, "model_type": "bert"}))):
        cfg = r["config"]
        T = cfg.block_size
        got = time_steps(cfg.model_type, {**s, "block_size": T, "mask_ratio": cfg.mask_ratio, "cms": cfg.cms},
                         device, autocast)
        if i == 0:  # design's first row is the reference itself
            reference[T] = got["input_tokens_per_s"]
        elif T not in reference:
            reference[T] = time_steps("bert", {**s, "block_size": T}, device, autocast)["input_tokens_per_s"]
        peak = checked_peak(peak, got["flops_per_s"], lambda: peak_flops(device, dtype))
        V = cfg.views[0]
        row = dict(model_type=cfg.model_type, mask_ratio=round(cfg.mask_ratio, 4), cms=cfg.cms, block_size=T,
                   input_tokens_per_s=round(got["input_tokens_per_s"], 1),
                   input_tokens_vs_bert=round(got["input_tokens_per_s"] / reference[T], 3),
                   counted_input_tokens_vs_bert=round(r["input_tokens_vs_bert"], 3),
                   view_positions_vs_bert=round(V * got["input_tokens_per_s"] / reference[T], 3),
                   counted_view_positions_vs_bert=round(r["view_positions_vs_bert"], 3),
                   mfu=round(got["flops_per_s"] / peak, 4))
        rows.append(row)
        print(f"| {row['model_type']} | {cfg.mask_ratio:.3g} | {'on' if cfg.cms else 'off'} | {T} | "
              f"{row['input_tokens_per_s']:,.0f} | {row['input_tokens_vs_bert']:.2f}x / "
              f"{row['counted_input_tokens_vs_bert']:.2f}x | {row['view_positions_vs_bert']:.2f}x / "
              f"{row['counted_view_positions_vs_bert']:.2f}x | {100 * row['mfu']:.1f}% |", flush=True)
    print(json.dumps({**s, "design": rows}))


if __name__ == "__main__":
    with user_errors("bench.py"):
        main(sys.argv[1:])
