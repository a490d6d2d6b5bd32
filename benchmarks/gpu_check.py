"""The GPU check: what only a CUDA GPU can show, measured through kvpipe's own runner, in one process.

    bash benchmarks/gpu_check.sh                       # on a CUDA machine: smollm2_135m, under 8 minutes
    bash benchmarks/gpu_check.sh --reduced --out /tmp/gpucheck   # tiny_random, seconds (forced without CUDA)

Checks: (a) offloaded caches cut peak GPU memory against dynamic at long context; (b) static +
torch.compile decodes faster than dynamic; (c) quantized caches (quanto and hqq int4) hold fewer KV
bytes and, on GPU, peak lower; (d) the out-of-memory fallback works under a real allocator limit.
Without CUDA the same jobs run small: (a) and (b) record their figures as not applicable, (d) injects
the MemoryError. Writes gpu_check.json and gpu_check.md; exits 1 if any applicable check failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from kvpipe import runner
from kvpipe.config import compose
from kvpipe.plan import make_plan
from kvpipe.report import human_bytes

# (prompt tokens, batch size, new tokens, warm-up calls, measured calls) per workload. Memory checks use
# a long context and a batch large enough that the KV cache dominates the peak; its peak comes at prefill,
# so few new tokens suffice (each offloaded step copies the whole cache both ways). The speed check uses
# batch 1, where decode is launch-bound and CUDA graphs pay.
SIZES = {
    "full": {"memory": (6000, 8, 32, 0, 2), "speed": (512, 1, 64, 1, 2), "fallback": (6000, 8, 32, 0, 1)},
    "reduced": {"memory": (512, 2, 8, 0, 1), "speed": (64, 1, 16, 1, 2), "fallback": (512, 2, 8, 0, 1)},
}
JOBS = {  # label -> (workload, cache overrides); run in this order: fallback after offload, compile last
    "dynamic": ("memory", ["cache=dynamic"]),
    "offloaded": ("memory", ["cache=offloaded"]),
    "static": ("memory", ["cache=static"]),
    "offloaded_static": ("memory", ["cache=offloaded_static"]),
    "fallback": ("fallback", ["cache=dynamic", "fallback=[offloaded]"]),
    "hqq_int4": ("memory", ["cache=quantized", "backend=hqq", "backend.nbits=4"]),
    "quanto_int4": ("memory", ["cache=quantized", "backend=quanto", "backend.nbits=4"]),
    "speed_dynamic": ("speed", ["cache=dynamic"]),
    "speed_static_compile": ("speed", ["cache=static", "cache.compile=true"]),
}
METRICS = ("peak_memory_bytes", "peak_reserved_bytes", "kv_cache_bytes", "decode_tokens_per_s",
           "decode_tokens_per_s_std", "compile_ms", "new_tokens", "prompt_tokens", "batch_size")
TAGS = ("cache.effective", "fallback_from", "fallback_to", "fallback_error", "device", "dtype")
QUANTO_BUILD_LIMIT_S = 150  # quanto compiles its CUDA extension once per environment, with nvcc


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not applicable on this device
    figures: dict
    detail: str


def job_overrides(model: str, workload: tuple, cache: list[str]) -> list[str]:
    prompt_tokens, batch_size, new_tokens, warmup, repeats = workload
    return [f"model={model}", "workload=long_context", f"workload.prompt_tokens={prompt_tokens}",
            f"workload.batch_size={batch_size}", f"workload.max_new_tokens={new_tokens}",
            f"workload.warmup={warmup}", f"workload.repeats={repeats}", "tracking=off", "quality=off", *cache]


def run(plan) -> dict:
    """One kvpipe job; its recorded metrics and tags, or the error that stopped it."""
    started = time.perf_counter()
    try:
        result = runner.run_job(plan)
    except Exception as exc:  # a job that cannot run fails its check; the other checks still run
        figures = {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"}
    else:
        figures = {**{k: result.metrics[k] for k in METRICS if k in result.metrics},
                   **{k: result.tags[k] for k in TAGS if k in result.tags}}
    release()
    figures["job_s"] = round(time.perf_counter() - started, 2)
    return figures


def release() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def errors(jobs: dict, *labels: str) -> str:
    return "; ".join(f"{label}: {jobs[label]['error']}" for label in labels if "error" in jobs[label])


def mib(value) -> str:
    return human_bytes(value) if isinstance(value, (int, float)) else "n/a"


def check_offload(jobs: dict, cuda: bool) -> Check:
    pairs = [("offloaded", "dynamic"), ("offloaded_static", "static")]
    figures = {label: jobs[label] for pair in pairs for label in pair}
    if failed := errors(jobs, *figures):
        return Check("offload_cuts_peak_memory", False, figures, f"a job failed: {failed}")
    if not cuda:
        as_documented = (jobs["offloaded"]["cache.effective"] == "dynamic"
                         and jobs["offloaded_static"]["cache.effective"] == "static")
        return Check("offload_cuts_peak_memory", None if as_documented else False, figures,
                     "not applicable without CUDA: cache=offloaded ran as "
                     f"{jobs['offloaded']['cache.effective']} and offloaded_static as "
                     f"{jobs['offloaded_static']['cache.effective']} (offloading off, as documented)")
    passed = all(jobs[off]["peak_memory_bytes"] < jobs[base]["peak_memory_bytes"] for off, base in pairs)
    return Check("offload_cuts_peak_memory", passed, figures, "; ".join(
        f"{off} peak {mib(jobs[off]['peak_memory_bytes'])} vs {base} {mib(jobs[base]['peak_memory_bytes'])}"
        for off, base in pairs))


def check_compile(jobs: dict, cuda: bool) -> Check:
    eager, compiled = jobs["speed_dynamic"], jobs["speed_static_compile"]
    figures = {"speed_dynamic": eager, "speed_static_compile": compiled}
    if failed := errors(jobs, *figures):
        return Check("static_compile_speeds_up_decode", False, figures, f"a job failed: {failed}")
    speedup = compiled["decode_tokens_per_s"] / eager["decode_tokens_per_s"]
    figures["speedup"] = round(speedup, 3)
    detail = (f"static+compile decodes {compiled['decode_tokens_per_s']:.0f} tok/s vs dynamic "
              f"{eager['decode_tokens_per_s']:.0f} tok/s (x{speedup:.2f}, compile {compiled.get('compile_ms', 0):.0f} ms)")
    if not cuda:
        return Check("static_compile_speeds_up_decode", None, figures,
                     detail + "; not applicable on CPU: the claim is about CUDA graphs")
    return Check("static_compile_speeds_up_decode", speedup > 1, figures, detail)


def check_quantized(jobs: dict, cuda: bool) -> Check:
    labels = ("dynamic", "hqq_int4", "quanto_int4")
    figures = {label: jobs[label] for label in labels}
    if failed := errors(jobs, *labels):
        return Check("quantized_cuts_kv_memory", False, figures, f"a job failed: {failed}")
    base = jobs["dynamic"]
    keys = ("kv_cache_bytes", "peak_memory_bytes") if cuda else ("kv_cache_bytes",)
    passed = all(jobs[q][k] < base[k] for q in labels[1:] for k in keys)
    detail = "; ".join(f"{q} " + ", ".join(f"{k.removesuffix('_bytes')} {mib(jobs[q][k])} vs dynamic {mib(base[k])}"
                                            for k in keys) for q in labels[1:])
    if not cuda:
        detail += "; peak memory not compared on CPU (resident-set growth is not a clean signal)"
    return Check("quantized_cuts_kv_memory", passed, figures, detail)


def check_fallback(figures: dict, how: str) -> Check:
    if "error" in figures:
        return Check("oom_fallback_under_limit", False, figures, f"{how}; the job failed: {figures['error']}")
    moved = (figures.get("fallback_from"), figures.get("fallback_to"))
    return Check("oom_fallback_under_limit", moved == ("dynamic", "offloaded"), figures,
                 f"{how}; fell back from {moved[0]} to {moved[1]}")


def run_fallback_cuda(plan, jobs: dict) -> Check:
    """Cap the allocator between the offloaded and the dynamic peak measured in check a."""
    import torch

    if failed := errors(jobs, "dynamic", "offloaded"):
        return check_fallback({"error": failed}, "no limit to set")
    fits = jobs["offloaded"].get("peak_reserved_bytes", jobs["offloaded"]["peak_memory_bytes"])
    needs = jobs["dynamic"]["peak_memory_bytes"]
    if fits >= needs:
        return check_fallback({"error": f"offloaded reserves {mib(fits)}, not below dynamic's {mib(needs)}"},
                              "no limit separates the two")
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (fits + needs) / 2 / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        figures = run(plan)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    figures.update(memory_fraction=fraction, limit_bytes=int(fraction * total))
    return check_fallback(figures, f"real allocator limit {mib(fraction * total)} (fraction {fraction:.4f})")


@contextmanager
def injected_oom(strategy: str):
    """No allocator limit exists on CPU: raise MemoryError whenever `strategy` generates."""
    real = runner.measured_generate

    def out_of_memory(plan, loaded, setup, batch):
        if plan.cache.strategy == strategy:
            raise MemoryError("injected by gpu_check: CPU has no allocator limit to hit")
        return real(plan, loaded, setup, batch)

    runner.measured_generate = out_of_memory
    try:
        yield
    finally:
        runner.measured_generate = real


def quanto_cuda_unbuildable(limit_s: int) -> str | None:
    """Build quanto's CUDA extension in a child process under a time limit; why not, or None when built."""
    code = "from optimum.quanto.library.extensions import get_extension; get_extension('quanto_cuda').lib"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)  # its own group: a timeout stops nvcc too
    try:
        output, _ = child.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return f"quanto's CUDA extension did not build within {limit_s} s (rerun: ninja resumes the build)"
    lines = output.strip().splitlines()
    return f"quanto's CUDA extension failed to build: {lines[-1] if lines else child.returncode}" if child.returncode else None


def exit_status(checks: list[Check]) -> int:
    """0 when no applicable check failed."""
    return 1 if any(check.passed is False for check in checks) else 0


def write_reports(out: Path, checks: list[Check], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    order = ["offload_cuts_peak_memory", "static_compile_speeds_up_decode", "quantized_cuts_kv_memory",
             "oom_fallback_under_limit"]
    checks = sorted(checks, key=lambda c: order.index(c.name) if c.name in order else len(order))
    document = {**meta, "exit_status": exit_status(checks), "checks": [asdict(c) for c in checks]}
    (out / "gpu_check.json").write_text(json.dumps(document, indent=2) + "\n")
    verdict = {True: "pass", False: "**FAIL**", None: "n/a"}
    lines = [f"# kvpipe GPU check ({meta['mode']})", "",
             f"Device: {meta['device']} · torch {meta['torch_version']} · transformers "
             f"{meta['transformers_version']} · model `{meta['model']}` · total wall time {meta['wall_s']:.0f} s", "",
             "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {verdict[c.passed]} | {c.detail} |" for c in checks]
    lines += ["", "| job | cache.effective | peak memory | KV cache | decode tok/s | job s |", "|---|---|---:|---:|---:|---:|"]
    jobs = {label: f for c in checks for label, f in c.figures.items() if isinstance(f, dict)}
    jobs.update({"fallback": c.figures for c in checks if c.name == "oom_fallback_under_limit"})
    for label, f in jobs.items():
        tps = f"{f['decode_tokens_per_s']:.0f} ± {f['decode_tokens_per_s_std']:.0f}" if "decode_tokens_per_s" in f else ""
        lines.append(f"| {label} | {f.get('cache.effective', f.get('error', ''))} | {mib(f.get('peak_memory_bytes'))} | "
                     f"{mib(f.get('kv_cache_bytes'))} | {tps} | {f.get('job_s', '')} |")
    lines += ["", f"Job sizes (prompt tokens, batch, new tokens, warm-up, repeats): {meta['sizes']}"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    parser.add_argument("--model", default=None, help="default: smollm2_135m, or tiny_random with --reduced")
    parser.add_argument("--reduced", action="store_true", help="small jobs; forced on without CUDA")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    mode = "reduced" if args.reduced or not cuda else "full"
    model = args.model or ("tiny_random" if mode == "reduced" else "smollm2_135m")
    sizes = SIZES[mode]
    started = time.perf_counter()
    # Compose every plan before measuring anything: an edit to conf/ mid-run cannot break the run.
    plans = {label: make_plan(compose(job_overrides(model, sizes[workload], cache)))
             for label, (workload, cache) in JOBS.items()}
    meta = {"mode": mode, "model": model, "sizes": sizes, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, no CUDA)"}
    checks: list[Check] = []

    def done(check: Check) -> None:
        checks.append(check)
        meta["wall_s"] = time.perf_counter() - started
        write_reports(args.out, checks, meta)  # after every check: a run stopped midway still leaves a report
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[check.passed]
        print(f"[{meta['wall_s']:6.1f} s] {verdict} {check.name}: {check.detail}", flush=True)

    print(f"kvpipe GPU check · {mode} · {model} · {meta['device']}", flush=True)
    jobs = {label: run(plans[label]) for label in ("dynamic", "offloaded", "static", "offloaded_static")}
    done(check_offload(jobs, cuda))
    if cuda:
        done(run_fallback_cuda(plans["fallback"], jobs))
    else:
        with injected_oom("dynamic"):
            done(check_fallback(run(plans["fallback"]), "injected MemoryError on cache=dynamic, not a real limit"))
    jobs["hqq_int4"] = run(plans["hqq_int4"])
    unbuildable = quanto_cuda_unbuildable(QUANTO_BUILD_LIMIT_S) if cuda else None
    jobs["quanto_int4"] = {"error": unbuildable} if unbuildable else run(plans["quanto_int4"])
    done(check_quantized(jobs, cuda))
    jobs.update({label: run(plans[label]) for label in ("speed_dynamic", "speed_static_compile")})
    done(check_compile(jobs, cuda))
    status = exit_status(checks)
    print(f"{'all applicable checks passed' if status == 0 else 'FAILED'} in {meta['wall_s']:.0f} s: "
          f"{args.out / 'gpu_check.md'}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
