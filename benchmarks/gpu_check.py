"""The GPU check: what only a CUDA GPU can show, measured through kvpipe's own runner, in one process.

    bash benchmarks/gpu_check.sh                                 # CUDA: smollm2_135m, under 8 minutes
    bash benchmarks/gpu_check.sh --reduced --out /tmp/gpucheck   # tiny_random, seconds (forced without CUDA)

Checks: offloaded caches cut peak GPU memory; the OOM fallback works under a real allocator limit;
quantized caches hold fewer KV bytes (and peak lower); static + compile decodes faster; on a model with
sliding-window layers (tiny_sliding, a Gemma-3-style random config), plan's bytes equal the caches', and
cache.offload_only_non_sliding=true keeps the sliding layers on the GPU. The reduced form runs the same
jobs small and judges what it can. Exits 1 if an applicable check failed. On CUDA it also reports each
job's TPOT against its floor on the GPU it ran on (the model bandwidth utilisation; not judged), so a
lent GPU checks `kvpipe plan --hardware`'s floors too.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

import pandas as pd
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from kvpipe.config import from_hydra
from kvpipe.errors import KvpipeError, first_line
from kvpipe.job import runner
from kvpipe.jobspec import compose, make_spec
from kvpipe.units import human_bytes

# (prompt tokens, batch, new tokens, warm-up calls, measured calls) per workload. The memory jobs use a
# long context and a batch at which the KV cache dominates the peak; the peak comes at prefill, so few new
# tokens suffice (every offloaded step copies the whole cache both ways). The speed jobs use batch 1,
# where eager decode is launch-bound and CUDA graphs pay.
SIZES = {
    "full": {"memory": (6000, 8, 32, 1, 2), "speed": (512, 1, 64, 1, 2), "fallback": (6000, 8, 32, 0, 1)},
    "reduced": {"memory": (256, 2, 4, 0, 1), "speed": (32, 1, 8, 1, 2), "fallback": (256, 2, 4, 0, 1)},
}
JOBS = {  # label -> (workload, cache overrides)
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
SLIDING_MODEL = "tiny_sliding"  # conf/model: two sliding layers (window 16) and one full, at any size
SLIDING_JOBS = {  # label -> (workload, cache overrides), all on SLIDING_MODEL
    "sliding_offload_all": ("memory", ["cache=offloaded_static", "cache.offload_only_non_sliding=false"]),
    "sliding_offload_full_only": ("memory", ["cache=offloaded_static", "cache.offload_only_non_sliding=true"]),
    "sliding_offloaded_dynamic": ("memory", ["cache=offloaded", "cache.offload_only_non_sliding=true"]),
    "sliding_quantized": ("memory", ["cache=quantized", "backend=hqq"]),
}
METRICS = (
    "peak_memory_bytes",
    "peak_reserved_bytes",
    "kv_cache_bytes",
    "kv_cache_host_bytes",
    "decode_tokens_per_s",
    "decode_tokens_per_s_std",
    "compile_ms",
    "new_tokens",
    "prompt_tokens",
    "batch_size",
    "tpot_ms",
    "decode_bytes_per_step",
    "memory_bandwidth_bytes_per_s",
)
TAGS = ("cache.effective", "fallback_from", "fallback_to", "fallback_error", "device", "dtype")
QUANTO_BUILD_LIMIT_S = 150  # quanto compiles its CUDA extension (nvcc) once per environment, on first use


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not applicable here
    figures: dict
    detail: str


def job_overrides(model: str, workload: tuple, cache: list[str]) -> list[str]:
    prompt_tokens, batch_size, new_tokens, warmup, repeats = workload
    return [
        f"model={model}",
        "workload=long_context",
        f"workload.prompt_tokens={prompt_tokens}",
        f"workload.batch_size={batch_size}",
        f"workload.max_new_tokens={new_tokens}",
        f"workload.warmup={warmup}",
        f"workload.repeats={repeats}",
        "tracking=off",
        "quality=off",
        *cache,
    ]


def run(spec) -> dict:
    """One kvpipe job: its recorded metrics and tags, or the error that stopped it."""
    import torch

    started = time.perf_counter()
    try:
        result = runner.run_job(spec)
    except Exception as exc:  # noqa: BLE001 - a job that cannot run fails its check; the others still run
        figures = {"error": f"{type(exc).__name__}: {first_line(exc)}"}
    else:
        figures = {
            **{k: result.metrics[k] for k in METRICS if k in result.metrics},
            **{k: result.tags[k] for k in TAGS if k in result.tags},
            **predicted_kv_bytes(spec, result),
        }
    gc.collect()  # what one job freed must not count against the next
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    figures["job_s"] = round(time.perf_counter() - started, 2)
    return figures


def predicted_kv_bytes(spec, result) -> dict:
    """What `kvpipe plan` predicts the job's cache holds: every layer (host and device together), and
    its sliding layers alone."""
    from kvpipe import model
    from kvpipe.cache.accounting import kv_shape

    metrics = result.metrics
    prompt, batch = int(metrics["prompt_tokens"]), int(metrics["batch_size"])
    new = int(metrics["kv_cache_tokens"]) - prompt + 1
    kv = kv_shape(model.read_shape(spec.model), batch, result.tags["dtype"])
    sliding = kv.with_layers(kv.sliding_windows)
    return {
        "predicted_kv_bytes": spec.strategy.predict_kv_bytes(kv, prompt, new),
        "predicted_sliding_bytes": spec.strategy.predict_kv_bytes(sliding, prompt, new) if sliding.layers else 0,
    }


def tpot_floors(jobs: dict, device_name: str) -> dict:
    """Each job's TPOT against its floor on the GPU it ran on (kvpipe plan --hardware's): the bytes a
    decode step moves (decode_bytes_per_step: weights + KV read) over the GPU's datasheet bandwidth
    (conf/hardware.yaml, found by torch's name for it), or, for a GPU not in the table, over the copy
    bandwidth the job measured. Model bandwidth utilisation (MBU) = floor / TPOT. Jobs whose traffic
    is not counted (offloading on CUDA) have no floor."""
    from kvpipe.predict import hardware

    entry = hardware.for_device_name(device_name)
    rows = []
    for label, figures in jobs.items():
        if not figures.get("decode_bytes_per_step") or not figures.get("tpot_ms"):
            continue
        bandwidth = entry.memory_bandwidth_bytes_per_s if entry else figures["memory_bandwidth_bytes_per_s"]
        floor_ms = figures["decode_bytes_per_step"] / bandwidth * 1e3
        rows.append({"job": label, "tpot_ms": figures["tpot_ms"], "tpot_floor_ms": floor_ms,
                     "mbu": floor_ms / figures["tpot_ms"], "bandwidth_bytes_per_s": bandwidth})  # fmt: skip
    source = (f"{entry.name}: {entry.memory_bandwidth_bytes_per_s / 1e12:.3g} TB/s, "
              f"{entry.sources['memory_bandwidth_gb_per_s'].split(',')[0]}" if entry
              else f"{device_name} is not in conf/hardware.yaml: each job's own measured copy bandwidth")  # fmt: skip
    return {"gpu": device_name, "hardware": entry.name if entry else None, "bandwidth_source": source, "jobs": rows}


def human(value) -> str:
    return human_bytes(value) if isinstance(value, (int, float)) else "n/a"


def judge(name: str, jobs: dict, labels: tuple, verdict) -> Check:
    """A check over some jobs: failed if any of them failed, else verdict(figures) -> (passed, detail)."""
    figures = {label: jobs[label] for label in labels}
    failed = "; ".join(f"{label}: {figures[label]['error']}" for label in labels if "error" in figures[label])
    if failed:
        return Check(name, False, figures, f"a job failed: {failed}")
    passed, detail = verdict(figures)
    return Check(name, passed, figures, detail)


def offload_verdict(figures: dict, claims: bool, device: str):
    pairs = [("offloaded", "dynamic"), ("offloaded_static", "static")]
    if not claims:
        ran_as = (figures["offloaded"]["cache.effective"], figures["offloaded_static"]["cache.effective"])
        expected = ("offloaded", "offloaded_static") if device == "cuda" else ("dynamic", "static")
        why = "reduced jobs are too small to show it" if device == "cuda" else "offloading needs CUDA"
        return None if ran_as == expected else False, (
            f"not applicable ({why}): cache=offloaded ran as {ran_as[0]} and offloaded_static as {ran_as[1]}"
        )
    peak = {label: figures[label]["peak_memory_bytes"] for pair in pairs for label in pair}
    return all(peak[off] < peak[base] for off, base in pairs), "; ".join(
        f"{off} peak {human(peak[off])} vs {base} {human(peak[base])}" for off, base in pairs
    )


def compile_verdict(figures: dict, claims: bool):
    eager, compiled = figures["speed_dynamic"], figures["speed_static_compile"]
    speedup = compiled["decode_tokens_per_s"] / eager["decode_tokens_per_s"]
    figures["speedup"] = round(speedup, 3)
    detail = (
        f"static+compile decodes {compiled['decode_tokens_per_s']:.0f} tok/s vs dynamic "
        f"{eager['decode_tokens_per_s']:.0f} (x{speedup:.2f}; compile {compiled.get('compile_ms', 0):.0f} ms)"
    )
    if not claims:
        return None, detail + "; not applicable: the claim is about CUDA graphs on the full-size model"
    return speedup > 1, detail


def quantized_verdict(figures: dict, claims: bool):
    base = figures["dynamic"]
    keys = ("kv_cache_bytes", "peak_memory_bytes") if claims else ("kv_cache_bytes",)
    passed = all(figures[q][k] < base[k] for q in ("hqq_int4", "quanto_int4") for k in keys)
    detail = "; ".join(
        f"{q} "
        + ", ".join(f"{k.removesuffix('_bytes')} {human(figures[q][k])} vs dynamic {human(base[k])}" for k in keys)
        for q in ("hqq_int4", "quanto_int4")
    )
    if not claims:
        detail += "; peak memory not compared in the reduced form (on CPU the process's peak is the interpreter and libraries, not a tiny model's cache)"
    return passed, detail


def sliding_verdict(figures: dict, device: str):
    """Predictions exact everywhere; on CUDA, offloading only the full layers leaves less in host RAM
    than offloading every layer, and no more than the full layer's own bytes."""
    wrong = [f"{label} {human(f['kv_cache_bytes'])} vs plan {human(f['predicted_kv_bytes'])}"
             for label, f in figures.items() if f["kv_cache_bytes"] != f["predicted_kv_bytes"]]  # fmt: skip
    exact = "plan = measured KV bytes for all four" if not wrong else "plan differs: " + "; ".join(wrong)
    if device != "cuda":
        return not wrong, exact + "; host-RAM split not applicable (offloading needs CUDA)"
    full_only, every = figures["sliding_offload_full_only"], figures["sliding_offload_all"]
    host = {label: f.get("kv_cache_host_bytes", 0) for label, f in figures.items()}
    ran = all(f.get("cache.effective", "").startswith("offloaded") for k, f in figures.items() if "offload" in k)
    split = 0 < host["sliding_offload_full_only"] < host["sliding_offload_all"]
    kept = full_only["kv_cache_bytes"] - host["sliding_offload_full_only"] >= full_only["predicted_sliding_bytes"]
    detail = (
        f"{exact}; host RAM holds {human(host['sliding_offload_full_only'])} with offload_only_non_sliding=true vs "
        f"{human(host['sliding_offload_all'])} with false (of {human(every['kv_cache_bytes'])})"
    )
    return not wrong and ran and split and kept, detail


def fallback_verdict(figures: dict, how: str):
    moved = (figures["fallback"].get("fallback_from"), figures["fallback"].get("fallback_to"))
    return moved == ("dynamic", "offloaded"), f"{how}; fell back from {moved[0]} to {moved[1]}"


def run_under_limit(spec, jobs: dict) -> str:
    """Run the fallback job with the allocator capped between check a's offloaded and dynamic peaks."""
    import torch

    fits = jobs["offloaded"].get("peak_reserved_bytes", jobs["offloaded"].get("peak_memory_bytes"))
    needs = jobs["dynamic"].get("peak_memory_bytes")
    if fits is None or needs is None or fits >= needs:
        jobs["fallback"] = {"error": f"no limit separates offloaded's {human(fits)} from dynamic's {human(needs)}"}
        return "real allocator limit"
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (fits + needs) / 2 / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        jobs["fallback"] = run(spec)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    jobs["fallback"].update(memory_fraction=fraction, limit_bytes=int(fraction * total))
    return (
        f"real allocator limit {human(fraction * total)} (fraction {fraction:.5f}), between offloaded's "
        f"{human(fits)} reserved and dynamic's {human(needs)} peak"
    )


def injected_oom(strategy: str):
    """No allocator limit to hit on CPU: raise MemoryError whenever `strategy` generates."""
    real = runner.measured_generate

    def out_of_memory(spec, *args):
        if spec.cache.strategy == strategy:
            raise MemoryError("injected by gpu_check: no real allocator limit here")
        return real(spec, *args)

    return mock.patch.object(runner, "measured_generate", out_of_memory)


def quanto_cuda_unbuildable(limit_s: int) -> str | None:
    """Build quanto's CUDA extension in a child under a time limit: why it could not, or None once built."""
    code = "from optimum.quanto.library.extensions import get_extension; get_extension('quanto_cuda').lib"
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # its own group: a timeout stops nvcc too
    try:
        output, _ = child.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return f"quanto's CUDA extension did not build within {limit_s} s (a rerun resumes the build)"
    last = (output.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
    return f"quanto's CUDA extension failed to build: {last}" if child.returncode else None


def exit_status(checks: list[Check]) -> int:
    """0 when no applicable check failed, else 1."""
    return 1 if any(check.passed is False for check in checks) else 0


def markdown_table(rows: list[list[str]], columns: list[str], align: str) -> str:
    """A markdown table of cells already formatted as text; `align` is one l or r per column."""
    colalign = [{"l": "left", "r": "right"}[a] for a in align]
    return pd.DataFrame(rows, columns=columns).to_markdown(index=False, disable_numparse=True, colalign=colalign)


def write_reports(out: Path, checks: list[Check], meta: dict, jobs: dict | None = None) -> None:
    """gpu_check.json (every figure) and gpu_check.md (a table of the checks, then one of the jobs)."""
    out.mkdir(parents=True, exist_ok=True)
    document = {**meta, "exit_status": exit_status(checks), "checks": [asdict(c) for c in checks]}
    (out / "gpu_check.json").write_text(json.dumps(document, indent=2) + "\n")
    verdict = {True: "pass", False: "**FAIL**", None: "n/a"}
    header = (
        f"Device: {meta['device']} · torch {meta['torch_version']} · transformers "
        f"{meta['transformers_version']} · model `{meta['model']}` · total wall time {meta['wall_s']:.0f} s · "
        f"exit status {document['exit_status']}"
    )
    check_rows = [[c.name, verdict[c.passed], c.detail] for c in checks]
    job_rows = []
    for label, f in (jobs or {}).items():
        tps = f"{f['decode_tokens_per_s']:.0f} ± {f['decode_tokens_per_s_std']:.0f}" if "error" not in f else ""
        job_rows.append(
            [
                label,
                str(f.get("cache.effective", f.get("error"))),
                human(f.get("peak_memory_bytes")),
                human(f.get("kv_cache_bytes")),
                tps,
                str(f.get("job_s", "")),
            ]
        )
    lines = [
        f"# kvpipe GPU check ({meta['mode']})",
        "",
        header,
        "",
        markdown_table(check_rows, ["check", "result", "detail"], "lll"),
        "",
        markdown_table(
            job_rows, ["job", "cache.effective", "peak memory", "KV cache", "decode tok/s", "job s"], "llrrrr"
        ),
    ]
    floors = meta.get("tpot_floors")
    if floors:
        floor_rows = [[r["job"], f"{r['tpot_ms']:.2f}", f"{r['tpot_floor_ms']:.3f}", f"{r['mbu']:.1%}"]
                      for r in floors["jobs"]]  # fmt: skip
        lines += ["", f"TPOT against its floor on {floors['gpu']} ({floors['bandwidth_source']}); "
                  "MBU = floor / TPOT, the model bandwidth utilisation:", "",
                  markdown_table(floor_rows, ["job", "TPOT ms", "floor ms", "MBU"], "lrrr")]  # fmt: skip
    lines += [
        "",
        "Job sizes as (prompt tokens, batch, new tokens, warm-up calls, measured calls): "
        + ", ".join(f"{name} {size}" for name, size in meta["sizes"].items()),
    ]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    parser.add_argument("--model", default=None, help="default: smollm2_135m, or tiny_random when reduced")
    parser.add_argument("--reduced", action="store_true", help="small jobs; forced on without CUDA")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    mode = "reduced" if args.reduced or not cuda else "full"
    claims = mode == "full"  # the GPU claims are judged on full-size jobs on CUDA only
    model = args.model or ("tiny_random" if mode == "reduced" else "smollm2_135m")
    started = time.perf_counter()
    # Compose every spec before measuring anything: an edit to conf/ mid-run cannot break the run.
    try:
        specs = {
            label: make_spec(compose(job_overrides(model, SIZES[mode][workload], cache)))
            for label, (workload, cache) in JOBS.items()
        }
        specs.update(
            {
                label: make_spec(compose(job_overrides(SLIDING_MODEL, SIZES[mode][workload], cache)))
                for label, (workload, cache) in SLIDING_JOBS.items()
            }
        )
    except (KvpipeError, HydraException, OmegaConfBaseException) as exc:  # e.g. --model nosuch: one line
        print(f"gpu_check: error: {exc if isinstance(exc, KvpipeError) else from_hydra(exc)}", file=sys.stderr)
        return 2
    meta = {
        "mode": mode,
        "model": model,
        "sizes": SIZES[mode],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "wall_s": 0.0,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, no CUDA)",
    }
    checks: list[Check] = []
    jobs: dict[str, dict] = {}

    def done(check: Check) -> None:
        checks.append(check)
        meta["wall_s"] = time.perf_counter() - started
        write_reports(args.out, checks, meta, jobs)  # after every check: a run stopped midway leaves a report
        print(
            f"[{meta['wall_s']:6.1f} s] {({True: 'PASS', False: 'FAIL', None: 'n/a '})[check.passed]} "
            f"{check.name}: {check.detail}",
            flush=True,
        )

    print(f"kvpipe GPU check · {mode} · {model} · {meta['device']}", flush=True)
    memory = ("dynamic", "offloaded", "static", "offloaded_static")
    jobs.update({label: run(specs[label]) for label in memory})
    device = "cuda" if cuda else "cpu"
    done(judge("offload_cuts_peak_memory", jobs, memory, lambda f: offload_verdict(f, claims, device)))
    # The fallback runs next, before the compiled job's CUDA graphs hold memory of their own.
    if claims:
        how = run_under_limit(specs["fallback"], jobs)
    else:
        how = "injected MemoryError on cache=dynamic, not a real memory limit"
        with injected_oom("dynamic"):
            jobs["fallback"] = run(specs["fallback"])
    done(judge("oom_fallback_under_limit", jobs, ("fallback",), lambda f: fallback_verdict(f, how)))
    jobs["hqq_int4"] = run(specs["hqq_int4"])
    unbuildable = quanto_cuda_unbuildable(QUANTO_BUILD_LIMIT_S) if cuda else None
    jobs["quanto_int4"] = {"error": unbuildable} if unbuildable else run(specs["quanto_int4"])
    done(
        judge(
            "quantized_cuts_kv_memory",
            jobs,
            ("dynamic", "hqq_int4", "quanto_int4"),
            lambda f: quantized_verdict(f, claims),
        )
    )
    jobs.update({label: run(specs[label]) for label in ("speed_dynamic", "speed_static_compile")})
    done(
        judge(
            "static_compile_speeds_up_decode",
            jobs,
            ("speed_dynamic", "speed_static_compile"),
            lambda f: compile_verdict(f, claims),
        )
    )
    jobs.update({label: run(specs[label]) for label in SLIDING_JOBS})
    done(
        judge(
            "sliding_window_plan_and_offload",
            jobs,
            tuple(SLIDING_JOBS),
            lambda f: sliding_verdict(f, device),
        )
    )
    if cuda:  # the floors are a GPU's: a CPU run has no datasheet to hold its TPOT against
        meta["tpot_floors"] = tpot_floors(jobs, meta["device"])
        write_reports(args.out, checks, meta, jobs)
        for row in meta["tpot_floors"]["jobs"]:
            print(f"TPOT {row['job']}: {row['tpot_ms']:.2f} ms vs floor {row['tpot_floor_ms']:.3f} ms "
                  f"(MBU {row['mbu']:.1%}; {meta['tpot_floors']['bandwidth_source']})", flush=True)  # fmt: skip
    status = exit_status(checks)
    print(f"{'all applicable checks passed' if status == 0 else 'FAILED'} in {meta['wall_s']:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
