"""What a search prints as it goes, on stderr: one line per trial (its outcome, figures, the best so far
and, after a measurement, the ETA) and the closing summary with the Pareto front's size."""

from __future__ import annotations

import sys
import time

from kvpipe.orchestrate.search.frontier import compresses, kind
from kvpipe.orchestrate.search.space import Point
from kvpipe.orchestrate.search.study import FAILED, INFERRED, MEASURED, PRUNED, REUSED, SearchStudy, Seen
from kvpipe.units import eta_text, human_bytes


def print_trial(search: SearchStudy, point: Point, seen: Seen) -> None:
    """The line for a point the search has just told the study about."""
    # an exhaustive pass counts every point it has covered; a budgeted one, the jobs it measured
    done = len(search.seen) if search.exhaustive else search.measured()
    total = len(search.space.points) if search.exhaustive else search.settings.trials
    counted = search.exhaustive or seen.outcome == MEASURED
    figures = ""
    if seen.values:
        memory, tpot, quality = seen.values
        figures = f" · {human_bytes(memory)}, TPOT {tpot:.1f} ms, {'1-acc' if search.quality else 'KL'} {quality:.3g}"
    best = best_so_far(search.seen)
    eta = eta_text(time.monotonic() - search.started, search.measured(), search.measured() + total - done)
    line = (
        (f"trial {done}/{total} {seen.outcome}" if counted else f"not counted, {seen.outcome}")
        + f": {point.label()}{figures}"
        + (f" ({seen.detail})" if seen.outcome in (PRUNED, INFERRED, FAILED) else "")
        + (f" · best so far: {best}" if best else "")
        + (f" · ETA {eta}" if seen.outcome == MEASURED else "")
    )
    print(line, file=sys.stderr, flush=True)


def best_so_far(seen: dict[Point, Seen]) -> str:
    """The fastest point that meets every limit, so far."""
    ok = [(s.values[1], p, s) for p, s in seen.items() if s.values and all(c <= 0 for c in s.constraints or [])]
    if not ok:
        return ""
    tpot, point, best = min(ok, key=lambda item: item[0])
    return f"{best.label or point.label()} TPOT {tpot:.1f} ms"


def front(seen: dict[Point, Seen]) -> list[tuple[Point, Seen]]:
    """The feasible points no other feasible point beats on every objective."""
    from kvpipe.decide.runs import non_dominated

    ok = [(p, s) for p, s in seen.items() if s.values and all(c <= 0 for c in s.constraints or [])]
    return [item for item, kept in zip(ok, non_dominated([s.values for _, s in ok])) if kept]


def print_closing_line(search: SearchStudy, inferred: dict) -> None:
    """The closing line: the points seen, by outcome (`inferred`: the points inferred to miss the
    quality limit), and how many of them make the Pareto front within the limits."""
    counts = {o: sum(s.outcome == o for s in search.seen.values()) for o in (MEASURED, REUSED, PRUNED, FAILED)}
    counts[INFERRED] = len([p for p in inferred if p not in search.seen or search.seen[p].outcome == INFERRED])
    print(
        f"search: {len(search.seen)} of {len(search.space.points)} configurations seen ("
        + ", ".join(f"{n} {o}" for o, n in counts.items())
        + f"); Pareto front of those within the limits: {len(front(search.seen))}",
        file=sys.stderr,
        flush=True,
    )
    missed = unexplored(search.space.points, [*search.seen, *inferred])
    if missed:
        print(
            f"search: not explored within the budget: {', '.join(missed)}; --trials "
            f"{search.measured() + len(missed)} would measure each once (the walk tries every kind before any twice)",
            file=sys.stderr,
            flush=True,
        )


def unexplored(points: list[Point], seen) -> list[str]:
    """The ways of shrinking the cache (each backend, each press) of which no point was seen, as overrides."""
    tried = {kind(p) for p in seen}
    kinds = dict.fromkeys(kind(p) for p in points if compresses(p) and kind(p) not in tried)
    return [f"backend={backend}" if backend else f"press={press}" for backend, press in kinds]
