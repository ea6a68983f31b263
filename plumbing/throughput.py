"""
What a training step achieves: the dtype a device computes fastest, the peak FLOP/s that MFU divides by, and training
steps timed (time_steps: bench.py and experiments/acceptance.py), with a profile of their top ops.
"""
import time

import torch

from flops import training_flops


PEAK_FLOPS = {  # dense bf16 tensor-core peaks, from the vendors' data sheets
    "H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "4090": 165e12,
}


def cpu_has_bf16():
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX), where bf16 autocast is about 2x faster than
    fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: stay with fp32
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fastest_dtype(device_type):
    """The dtype training should autocast to by default: bf16 where the device computes it natively."""
    if device_type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_bf16() else "float32"


def peak_from_table(device, dtype):
    """A known GPU's datasheet bf16 peak (PEAK_FLOPS), else None."""
    if device.type == "cuda" and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        return next((value for key, value in PEAK_FLOPS.items() if key in name), None)
    return None


def peak_flops(device, dtype, trials=10):
    """Peak FLOP/s of the device: from PEAK_FLOPS for known GPUs, else measured with a large matmul, the best of
    `trials` (a trial slowed by other work on the machine only ever lowers its own time's rank)."""
    table = peak_from_table(device, dtype)
    if table:
        return table
    # a CPU without native bf16 emulates it about 250x slower than fp32: a smaller matmul measures it in seconds
    n = 512 if device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_bf16() else 2048
    gen = torch.Generator(device).manual_seed(0)  # leaves the global RNG alone, so resumed runs stay exact
    a, b = (torch.randn(n, n, generator=gen, device=device).to(dtype) for _ in range(2))
    a @ b  # warm up
    best = float("inf")
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def checked_peak(peak, achieved, measure):
    """The peak to divide achieved FLOP/s by, so that MFU cannot pass 100%. A training step cannot outrun a plain
    matmul on the same device, so a measured peak below what a run achieves was measured while other work held the
    machine: measure again (measure()), and never divide by less than what was achieved."""
    return peak if achieved <= peak else max(measure(), achieved)


class Peak:
    """The peak FLOP/s of a run's devices together, that MFU divides by: measured again, and never below what the run
    achieved, when a run beats it (checked_peak)."""

    def __init__(self, device, dtype, processes):
        self.device, self.dtype, self.processes = device, dtype, processes
        self.from_table = peak_from_table(device, dtype) is not None
        self.flops = peak_flops(device, dtype) * processes

    @property
    def per_device(self):
        return self.flops / self.processes

    def measure_again(self, achieved):
        """Whether the run beat the peak (achieved FLOP/s); if so the peak is measured again."""
        if achieved <= self.flops:
            return False
        self.flops = checked_peak(self.flops, achieved, lambda: self.processes * peak_flops(self.device, self.dtype))
        return True


def time_steps(model_type, s, device, autocast):
    """Time s["steps"] training steps of one model: a dict of its config, input tokens/s, view positions/s,
    FLOP/s, the seconds of the untimed warmup (compilation happens there), the peak device memory (CUDA) and,
    with s["flash_check"], the flash check's outcome (True, or the error it raised)."""
    from configurator import make_config  # only the timer builds models: the counts read a config alone
    from model import MODELS
    torch.manual_seed(s["seed"])
    t_start = time.perf_counter()
    cfg = make_config({**s, "model_type": model_type})
    model = MODELS[model_type](cfg).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device.type)
    step_fn = torch.compile(model) if s["compile"] else model
    B, T = s["batch_size"], s["block_size"]
    idx = torch.randint(0, cfg.mask_token_id, (B, T), device=device)  # text ids, of a compact vocabulary too
    gen = torch.Generator(device).manual_seed(s["seed"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        with autocast:
            loss, _ = step_fn(idx, *model.draw(B, T, generator=gen, device=device))
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
    if s["profile"]:  # after the clock stopped: the profiler's own overhead stays out of the numbers
        print(f"{model_type}: {profile(step, s['steps'], device)}")
    out = dict(config=cfg, input_tokens_per_s=B * T / dt, view_positions_per_s=B * cfg.views[0] * T / dt,
               flops_per_s=training_flops(cfg, model_type, B) / dt, warmup_s=t0 - t_start,
               peak_memory=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)
    if s["flash_check"]:
        try:
            flash_check(model, idx, autocast)
            out["flash"] = True
        except RuntimeError as e:  # SDPA's "No available kernel", with its reasons
            out["flash"] = " ".join(str(e).split())
    return out


def profile(step, steps, device, rows=12):
    """The top ops of `steps` calls of step() by self time: a table, its last column the share of the total."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            loss = step()
        loss.item()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events)
    lines = [f"{'op':60s} {'calls':>6s} {'ms/step':>8s} {'share':>6s}"]
    for e in events[:rows]:
        t = getattr(e, key)
        lines.append(f"{e.key[:60]:60s} {e.count // steps:6d} {t / steps / 1e3:8.2f} {100 * t / total:5.1f}%")
    return "top ops by self time\n" + "\n".join(lines)


def flash_check(model, idx, autocast):
    """One training step and one encode() with only FlashAttention allowed: SDPA raises if it cannot serve them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), autocast:
        model(idx)[0].backward()  # views sampled inside, as in training
        with torch.no_grad():
            model.encode(idx)
