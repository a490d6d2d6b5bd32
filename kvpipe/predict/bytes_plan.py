"""The plan: KV-cache and weight bytes from a model's config alone, before any weight loads.

Per cache strategy: what a cached token costs, the cache at chosen context lengths, and the longest
context that fits beside the weights in a memory budget (`kvpipe plan`, kvpipe.commands.plan, prints
it as tables or JSON; `kvpipe advise` shows it before it searches). Each row
is its strategy's own `predict_kv_bytes`, which follows how its transformers cache layers (and
kvpipe's quantized layers) store their tensors, so it equals `kv_cache_bytes` of a real cache
exactly (tests/test_capacity.py runs both).

A context is prompt + new tokens, as the workload check counts it against the model's positions. The
cache then holds context - 1 tokens: the last generated token is never fed back.

`--hardware NAME` adds the floors of TPOT and TTFT on an accelerator of conf/hardware.yaml (kvpipe.predict.speed,
.floors), and fits then counts the transients too; `--hardware local` measures this machine and
calibrates predictions on its runs (kvpipe.predict.calibration).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kvpipe import cache, model
from kvpipe.cache.accounting import KvShape, UnpredictableLayers, kv_shape
from kvpipe.errors import ConfigError, KvpipeError, first_line
from kvpipe.model.weights import weights
from kvpipe.predict import hardware, speed
from kvpipe.predict import local_runs as machine_runs
from kvpipe.predict.costs import costs_for
from kvpipe.predict.floors import ModelCosts, split
from kvpipe.predict.in_flight import InFlight, requests_in_flight


def predict_kv_bytes(spec, kv, prompt_tokens: int, new_tokens: int) -> int:
    """What kv_cache_bytes reports for the spec's cache once new_tokens follow the prompt (all layers)."""
    return spec.strategy.predict_kv_bytes(kv, prompt_tokens, new_tokens)


def variants(spec, shape) -> list[tuple[str, object]]:
    """(label, spec) for every row: each registered strategy's variants of the spec's cache choice, in
    table order, then the eviction presses (press_variants)."""
    plain = replace(spec.cache_choice, press=None)
    rows = [row for strategy in cache.registered() for row in strategy.plan_variants(plain, shape)]
    return [(label, spec.with_choice(choice)) for label, choice in rows + press_variants(spec.cache_choice, shape)]


def press_variants(choice, shape) -> list[tuple[str, object]]:
    """Rows for eviction: the job's press (press=...) on each cache it composes with, or without one,
    each press at its middle ratio on the first cache it composes with; a press the model cannot take
    has no row."""
    chosen = choice.press is not None
    presses = [choice.press_class] if chosen else [p for p in cache.presses.registered() if p.evicts]
    rows = []
    for press in presses:
        try:
            press.check_for_model(shape.model_type, shape.full_layers)
        except ConfigError:
            continue
        settings = choice.press if chosen else config_for(press)
        for strategy in cache.registered():
            if strategy.press_layers not in press.composes_with:
                continue
            label, variant = strategy.plan_variants(replace(choice, press=None), shape)[0]
            pressed = replace(variant, press=settings)
            rows.append((f"{label} + {pressed.strategy.press.label()}", pressed))
            if not chosen:
                break
    return rows


def config_for(press):
    """The press config of `press` at its middle search ratio (its other settings at their defaults)."""
    from kvpipe.jobspec import schema

    ratio = press.search_ratios[len(press.search_ratios) // 2]
    return schema.option_schema(press)(ratio=ratio)


def largest_context(kv_bytes_at, available_bytes: int, cap: int) -> int:
    """Largest context <= cap whose cache (kv_bytes_at(context), growing with it) fits; 0 if none."""
    if available_bytes <= 0 or kv_bytes_at(2) > available_bytes:
        return 0
    low, high = 2, cap  # low always fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if kv_bytes_at(middle) <= available_bytes else (low, middle - 1)
    return low


@dataclass(frozen=True)
class PlanRow:
    """One strategy variant: what a token costs, what its sliding layers hold, the figures at each
    context (speed.Row), and the longest context that fits (None: no memory was given)."""

    label: str
    kv_bytes_per_token: float
    window_bytes: int | None  # models with sliding-window layers only
    fits_up_to: int | None
    capacity: InFlight | None  # the most requests of one size at once (--request-tokens, with a memory)
    figures: speed.Row


@dataclass(frozen=True)
class Plan:
    """Everything `kvpipe plan` shows, computed: no printing here."""

    spec: object
    shape: object  # ModelShape
    device: str
    dtype: str
    kv: KvShape
    cap: int  # the model's positions (or 2**24 where it names none)
    contexts: list[int]
    weights: object  # model.weights.Weights
    costs: ModelCosts
    budget: int | None  # --memory-budget
    memory: int | None  # the budget, else the accelerator's memory
    hardware_name: str | None
    accelerator: object | None  # hardware.Hardware
    local_runs: object | None  # machine_runs.LocalRuns
    rows: list[PlanRow]
    notes: list[str]
    host_memory: int | None = None  # host RAM an offloaded cache's capacity counts: --host-memory, else the hardware's

    @property
    def new_tokens(self) -> int:
        return self.spec.workload.max_new_tokens

    @property
    def available(self) -> int | None:
        """Memory left beside the weights, for the cache (and with a hardware, the transients)."""
        return None if self.memory is None else self.memory - self.weights.bytes

    def as_dict(self) -> dict:
        """The plan as one JSON document (`kvpipe plan --json`)."""
        return {
            "model": self.spec.model.name, "device": self.device, "dtype": self.dtype, "batch_size": self.kv.batch_size,
            "new_tokens": self.new_tokens, "max_positions": self.shape.max_positions or None,
            "weights": {"bytes": self.weights.bytes, "exact": self.weights.exact, "source": self.weights.source},
            "weights_read_bytes_per_step": self.costs.weights_read(self.kv.batch_size),
            "memory_bytes": self.memory,
            "host_memory_bytes": self.host_memory,
            "fits_counts": "weights + KV cache" + (" + the larger transient" if self.accelerator is not None else ""),
            "hardware": self.accelerator.as_dict() if self.accelerator is not None else None,
            "calibration": speed.calibration_document(self.local_runs, [row.figures for row in self.rows]),
            "rows": [
                {"strategy": row.label, "kv_bytes_per_token": row.kv_bytes_per_token, "fits_up_to": row.fits_up_to,
                 "contexts": [at.as_dict() for at in row.figures.contexts],
                 **({"capacity": asdict(row.capacity)} if row.capacity else {})}
                for row in self.rows
            ],
            "notes": self.notes,
        }  # fmt: skip


def make_plan(spec, budget: int | None = None, contexts: list[int] | None = None, device: str | None = None,
              hardware_name: str | None = None, request_tokens: int | None = None,
              calibrate_on: list[int] | None = None, host_memory: int | None = None) -> Plan:  # fmt: skip
    """The plan for a spec: every strategy variant at each context (default: 1024, 4096 and the
    model's maximum); with a hardware, the floors there (and on local hardware, the calibration);
    with request_tokens and a memory, each variant's capacity: the most such requests at once;
    calibrate_on: the prompt lengths whose runs the local calibration reads (default: all); host_memory:
    the host RAM an offloaded cache's capacity counts (default: the hardware's, where it names one)."""
    try:
        shape = model.read_shape(spec.model)
    except OSError as exc:  # a hub id with neither network nor a local copy
        raise KvpipeError(
            f"model.name_or_path={spec.model.name_or_path!r} has no readable config: {first_line(exc)}"
        ) from exc
    rows = variants(spec, shape)
    for _, variant in rows:
        if any(name.startswith("backend.") for name in variant.read_fields()):
            variant.strategy.check()  # the backend settings of the quantized rows, whatever cache= says
    if shape.has_sliding_layers:
        rows = [(label, variant) for label, variant in rows if variant.strategy.supports_sliding_window]
    accelerator = None if hardware_name in (None, hardware.LOCAL) else hardware.get(hardware_name)
    if accelerator is not None:
        if device not in (None, accelerator.device):
            raise ConfigError(
                "--device", device, f"--hardware {hardware_name} runs on {accelerator.device}; omit --device"
            )
        device = accelerator.device
    device = device or (model.resolve_device("auto") if spec.model.device == "auto" else spec.model.device)
    dtype = model.dtype_name(spec.model.dtype, device)
    try:
        kv = kv_shape(shape, spec.workload.batch_size, dtype)
    except UnpredictableLayers as exc:
        raise KvpipeError(f"kvpipe plan: {exc}") from exc
    new_tokens = spec.workload.max_new_tokens
    cap = shape.context_cap
    contexts = contexts or sorted({c for c in (1024, 4096) if c < cap} | {cap})
    weight = weights(spec.model, dtype)
    costs = costs_for(spec, device, dtype, kv.batch_size)
    local_runs = None
    if hardware_name == hardware.LOCAL:
        from kvpipe.job.threads import use_threads

        try:
            device = model.resolve_device(device)
        except KvpipeError as exc:  # --device cuda on a machine without one
            raise KvpipeError(
                "--hardware local measures this machine, which has no CUDA GPU; omit --device cuda"
            ) from exc
        threads = use_threads(spec.model, device)  # measured with the threads a run would use
        accelerator = hardware.local(device, dtype)
        local_runs = machine_runs.read_local_runs(spec, dtype, device, threads, calibrate_on)
    if accelerator is not None:
        accelerator.peak_flops(dtype)  # an entry without this dtype: one line, before any table
    memory = budget if budget is not None or accelerator is None else accelerator.memory_bytes
    if host_memory is None and accelerator is not None:
        host_memory = accelerator.host_memory_bytes
    available = None if memory is None else memory - weight.bytes
    plan_rows = []
    for label, variant in rows:
        strategy = variant.strategy
        on_device = strategy.device_kv_shape(kv, device)

        def needs_at(context: int, strategy=strategy, on_device=on_device) -> int:
            """Beside the weights: the cache, and with a hardware the larger transient too."""
            if accelerator is None:
                return strategy.predict_kv_bytes(on_device, *split(context, new_tokens))
            cost = costs.at(strategy, *split(context, new_tokens))
            return cost.memory_bytes - cost.weights_bytes

        figures = speed.build_row(label, variant, spec, costs, contexts, cap, accelerator, dtype, memory, local_runs)
        plan_rows.append(
            PlanRow(
                label=label,
                kv_bytes_per_token=strategy.bytes_per_token(on_device),
                window_bytes=strategy.window_bytes(on_device) if shape.has_sliding_layers else None,
                fits_up_to=None if available is None else largest_context(needs_at, available, cap),
                capacity=None
                if request_tokens is None or memory is None
                else requests_in_flight(
                    variant, strategy, device, dtype, request_tokens, memory, accelerator, host_memory
                ),
                figures=figures,
            )
        )
    notes = _notes(spec, shape, device, cap, contexts, pressed=any(variant.press is not None for _, variant in rows))
    if accelerator is not None:
        notes.append(
            "with --hardware, fits counts weights + KV cache + the larger of the prefill's largest activation and "
            f"the layer copy ({LAYER_COPY}); without it, weights + KV cache"
        )
    return Plan(spec, shape, device, dtype, kv, cap, contexts, weight, costs, budget, memory, hardware_name,
                accelerator, local_runs, plan_rows, notes, host_memory)  # fmt: skip


# What plan's "layer copy" is: a decode step's dense copy of one layer beside the cache, which only some
# strategies make (kvpipe.cache: Strategy.dequantized_copy_bytes)
LAYER_COPY = "one layer's dense copy a decode step makes beside the cache: a quantized layer dequantized, a paged layer's pages gathered"


def _notes(spec, shape, device: str, cap: int, contexts: list[int], pressed: bool) -> list[str]:
    """The plan's footnotes; pressed: whether it shows rows with a press."""
    notes = [f"* beyond the model's {cap:,} positions: kvpipe would refuse it"] if max(contexts) > cap else []
    if shape.has_sliding_layers:
        notes.append(
            f"KV B/token is what each token adds past the windows (the {shape.full_layers} full-attention "
            + ("layer grows" if shape.full_layers == 1 else "layers grow")
            + ", the sliding ones do not); windows is what the sliding layers hold once full, a fixed cost (quantized "
            "windows: at most, a residual short of its flush). A one-token output pins the whole prompt in them: "
            "transformers keeps a view of it"
        )
    offloading = [s for s in cache.registered() if s.offloading]
    if offloading and device == "cuda" and shape.num_layers > 2:
        kept = (
            "; sliding layers stay on the device where cache.offload_only_non_sliding=true (offloaded_static's default)"
            if shape.has_sliding_layers
            else ""
        )
        notes.append(
            "offloaded rows count the device only (the two largest offloaded layers: the one in use and the next, "
            f"prefetched{kept}); host RAM holds the rest (with --request-tokens, capacity counts it)"
        )
    elif offloading and device != "cuda":
        notes.append("without CUDA, " + " and ".join(f"{s.name} runs as {s.runs_as_without_cuda}" for s in offloading))
    for strategy in cache.registered():
        notes += strategy.plan_notes(spec.cache_choice, shape)
    if pressed:
        notes.append(
            "+ press rows: after prefill each full-attention layer keeps what the press leaves of the prompt "
            "(1 - press.ratio, rounded up), and the generated tokens after it (streaming: never more than its budget); "
            "their KV B/token is a prompt token's share"
        )
    return notes
