"""The space `kvpipe advise` searches: every cache configuration the registries offer for one model.

Each strategy and backend lists its own points (`search_points`): the dense strategies and their
variants (static + compile), and per quantization backend its bit widths, axis layouts, the group
sizes that divide this model's head_dim, and residual lengths. Each eviction press (kvpipe.cache.presses)
lists its ratios, on the dense cache it composes with. A point is a set of Hydra overrides.

Optuna sees the space flat: one categorical parameter per dimension (the strategy variant, backend,
backend.nbits, axis, group size, residual length), every one present in every trial, so that NSGA-II's crossover and
mutation work on all of them (a conditional space would leave them to random sampling). A trial's
parameters decode to the nearest point: a dimension its strategy or backend does not read is ignored,
and a value its backend does not take (quanto has no 3-bit form) becomes the nearest it does. Trials
that decode to one point measure it once.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpipe import cache
from kvpipe.cache import backends

# Overrides a search may set, and so the ones a user's override narrows rather than fixes
DIMENSIONS = ("cache", "backend", "backend.nbits", "axis", "backend.q_group_size", "backend.residual_length",
              "press", "press.ratio")  # fmt: skip
# What Optuna sees, in decoding order: each narrows the points left. `variant` is the strategy with its
# own settings and press (cache=static cache.compile=true, cache=dynamic press=snapkv), quantized for every
# quantized point.
PARAMETERS = ("variant", *(name for name in DIMENSIONS[1:] if name != "press"))
GROUP_SIZES = (32, 64, 128)
RESIDUAL_LENGTHS = (0, 64, 128, 256)


@dataclass(frozen=True)
class Point:
    """One configuration: its overrides, in DIMENSIONS order."""

    settings: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, overrides: dict[str, str]) -> "Point":
        ordered = [name for name in DIMENSIONS if name in overrides]
        ordered += sorted(name for name in overrides if name not in DIMENSIONS)
        return cls(tuple((name, overrides[name]) for name in ordered))

    def get(self, name: str) -> str | None:
        if name == "variant":
            own = [f"{k}={v}" for k, v in self.settings if k in ("cache", "press") or k.startswith("cache.")]
            return " ".join(own) if self.get("backend") is None else "cache=quantized"
        return dict(self.settings).get(name)

    def overrides(self) -> list[str]:
        return [f"{name}={value}" for name, value in self.settings]

    def label(self) -> str:
        return " ".join(self.overrides())


@dataclass
class Space:
    points: list[Point]
    left_out: list[str]  # what the registries offer that this space does not measure, and why

    def choices(self) -> dict[str, list[str]]:
        """Each dimension's values over every point, in first-seen order."""
        found: dict[str, list[str]] = {name: [] for name in PARAMETERS}
        for point in self.points:
            for name in PARAMETERS:
                value = point.get(name)
                if value is not None and value not in found[name]:
                    found[name].append(value)
        return {name: values for name, values in found.items() if values}

    def decode(self, params: dict[str, str]) -> Point:
        """The point a trial's parameters mean: each dimension in turn keeps the points that have the
        value asked for, or the nearest value they have; a dimension none of them reads is skipped."""
        left = self.points
        for name in PARAMETERS:
            values = [v for v in dict.fromkeys(p.get(name) for p in left) if v is not None]
            if not values or name not in params:
                continue
            wanted = params[name] if params[name] in values else _nearest(params[name], values)
            left = [p for p in left if p.get(name) in (wanted, None)]
        return left[0]

    def encode(self, point: Point) -> dict[str, str]:
        """Parameters that decode to `point` (dimensions it does not read take their first value)."""
        return {name: point.get(name) or values[0] for name, values in self.choices().items()}


def _nearest(value: str, values: list[str]) -> str:
    """The closest of `values` by number where both are numbers (ties: the smaller), else the first."""
    try:
        return min(values, key=lambda v: (abs(float(v) - float(value)), float(v)))
    except ValueError:
        return values[0]


def build(head_dim: int, device: str, restrict: dict[str, list[str]] | None = None,
          group_sizes=GROUP_SIZES, residual_lengths=RESIDUAL_LENGTHS, shape=None) -> Space:  # fmt: skip
    """Every point the registries offer on this model (its `shape`, where known) and device, less those
    `restrict` rules out (dimension -> the values the user allows)."""
    restrict = restrict or {}
    # values the user names are the values searched, whether or not the defaults hold them
    group_sizes = [int(v) for v in restrict.get("backend.q_group_size", group_sizes)]
    residual_lengths = [int(v) for v in restrict.get("backend.residual_length", residual_lengths)]
    left_out = []
    points = []
    for strategy in cache.registered():
        if strategy.runs_as_without_cuda and device != "cuda":
            left_out.append(f"cache={strategy.name} (it runs as {strategy.runs_as_without_cuda} without CUDA)")
            continue
        points += [Point.of(p) for p in strategy.search_points(head_dim, group_sizes, residual_lengths)]
    # a space narrowed to caches or backends asks about those; presses join when unnarrowed or named
    if not restrict or restrict.keys() & {"press", "press.ratio"}:
        points += _press_points(shape, left_out)
    for backend in backends.registered():
        reason = _unavailable(backend)
        if reason:
            left_out.append(f"backend={backend.name} ({reason})")
            points = [p for p in points if p.get("backend") != backend.name]
    for name, allowed in restrict.items():
        points = [p for p in points if p.get(name) is None or p.get(name) in allowed]
        # a dense point has no backend: restricting the backend (or nbits, ...) leaves quantized points only,
        # and those of another family the user also named (backend=quanto press=snapkv: both families)
        others = [other for other in restrict if other not in (name, "cache")]
        points = [
            p
            for p in points
            if p.get(name) is not None or name == "cache" or "cache" in restrict or any(p.get(o) for o in others)
        ]
    return Space(points=list(dict.fromkeys(points)), left_out=left_out)


def _press_points(shape, left_out: list[str]) -> list[Point]:
    """Each press's ratios on the dense cache it composes with, where the model lets it evict."""
    from kvpipe.errors import ConfigError

    dense = [s.name for s in cache.registered() if s.press_layers == "dense"][:1]
    points = []
    for press in cache.presses.registered():
        if not press.evicts or not dense:
            continue
        try:
            if shape is not None:
                press.check_for_model(shape.model_type, shape.full_layers)
        except ConfigError as exc:
            left_out.append(f"press={press.name} ({exc.expected.split(';')[0]})")
            continue
        points += [Point.of({"cache": dense[0], **point}) for point in press.search_points()]
    return points


def _unavailable(backend) -> str | None:
    from kvpipe.errors import KvpipeError

    try:
        backend.require_available()
    except KvpipeError as exc:
        return str(exc).split(";")[0]
    return None
