"""The live progress display of `syncopate tune` and its closing summary (rich; user-facing only)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from syncopate.autotuner.confirm import Verdict
from syncopate.autotuner.coordinator import SweepProgress, WorkloadRun
from syncopate.autotuner.strategies import StudyContinued
from syncopate.records import OBJECTIVE_DEVICE, OBJECTIVE_EAGER, TrialRecord, objective

__all__ = ["LiveProgress", "WorkloadSummary", "below_bound_note", "fmt_duration", "overhead_line"]


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _speedup(x: float | None) -> str:
    return f"{x:.2f}×" if x is not None else "–"


class _View:
    """Renders the current state each time rich refreshes."""

    def __init__(self, progress: SweepProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Table:
        p = self.progress
        failures = p.failures
        head = Text.assemble(
            ("tuning ", "bold"),
            (p.sweep_name, "bold cyan"),
            f" on {p.topology} · {p.where or f'{p.gangs} gang(s)'}",
            f" · elapsed {fmt_duration(p.elapsed_s)} · ETA {fmt_duration(p.eta_s())}",
            (f" · stopping: {p.stopping}", "yellow") if p.stopping else "",
        )
        counts = Text.assemble(
            f" {p.done}/{p.total} trials · ",
            (f"{sum(failures.values())} failed", "red" if failures else "green"),
            f" ({', '.join(f'{s} {n}' for s, n in sorted(failures.items()))})" if failures else "",
        )
        bar = Table.grid()
        bar.add_row(ProgressBar(total=max(p.total, 1), completed=p.done, width=40), counts)
        run = p.latest
        label = "best so far" if p.source == "measured" else f"best so far ({p.source}, not measured)"
        if run is not None and run.best is not None:
            best = Text.assemble(
                f"{label}: ",
                (str(run.workload), "cyan"),
                f"  {run.best_us():.1f} µs {run.mode}  ",
                (_speedup(run.speedup()), "bold green"),
                " over torch_seq  ",
                run.best.candidate.short(),
            )
        else:
            best = Text(f"{label}: –")
        grid = Table.grid()
        for row in (head, bar, best):
            grid.add_row(row)
        return grid


class LiveProgress:
    """A rich Live display of a :class:`SweepProgress`, redrawn four times a second from rich's own
    thread (the coordinator only updates the state); a context manager."""

    def __init__(self, progress: SweepProgress, console: Console) -> None:
        self._console = console
        self._live = Live(_View(progress), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._live.__exit__(*exc)
        if not self._console.is_terminal:  # the last frame, written to a file or pipe, ends mid-line
            self._console.line()


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadSummary:
    """One workload at the end of a run."""

    workload: str
    planned: int
    stored_before: int
    measured: int
    failures: dict[str, int]
    best: TrialRecord | None
    """The winner: the declared one where the best few were measured again, else the fastest ok
    trial of the sweep for the workload in this environment (trials stored before a resume
    included), of the sweep's source; its speedup is over the same sweep's baselines."""
    torch_seq_us: float | None
    """torch_seq's time in the objective (None where it has none)."""
    bound_us: float | None
    verdict: Verdict | None = None
    """The noise-aware verdict, where the best few were measured again."""
    continued: StudyContinued | None = None
    """The persistent study the strategy carried on from other sweeps, whose candidates this
    sweep did not measure again (so `best` is this sweep's best among the others)."""
    objective: str = OBJECTIVE_DEVICE
    """What `best_us` and `torch_seq_us` are: `eager` (back-to-back eager time per call), `device`,
    or `device (no eager measurement)` where the sweep ranks in mode eager but the winner has none."""

    @classmethod
    def of(
        cls, run: WorkloadRun, best: TrialRecord | None, verdict: Verdict | None = None
    ) -> WorkloadSummary:
        seq = run.baselines.get("torch_seq")
        declared = verdict is not None and bool(verdict.contenders or verdict.guard)
        if declared:
            best = verdict.trial
        obj = (
            verdict.objective
            if declared
            else (objective(run.mode, best.eager_us) if best is not None else OBJECTIVE_DEVICE)
        )
        seq_us = None if seq is None else (seq.eager_us if obj == OBJECTIVE_EAGER else seq.median_us)
        return cls(
            workload=run.workload.key(),
            planned=run.strategy.planned,
            stored_before=run.stored_before,
            measured=run.measured,
            failures={s: n for s, n in run.statuses.items() if s != "ok"},
            best=best,
            torch_seq_us=seq_us,
            bound_us=run.bound_us(),
            verdict=verdict if verdict is not None and verdict.contenders else None,
            continued=run.strategy.continued,
            objective=obj,
        )

    @property
    def best_us(self) -> float | None:
        """The winner's time in the objective: pooled over its re-measurements where there were any."""
        if self.verdict is not None:
            return self.verdict.pooled_median_us
        if self.best is None:
            return None
        return self.best.eager_us if self.objective == OBJECTIVE_EAGER else self.best.median_us

    @property
    def device_us(self) -> float | None:
        """The winner's device time (what the overlap bound is comparable with)."""
        if self.verdict is not None and self.objective != OBJECTIVE_EAGER:
            return self.verdict.pooled_median_us
        return self.best.median_us if self.best is not None else None

    @property
    def speedup(self) -> float | None:
        if self.best_us is None or self.torch_seq_us is None or not self.best_us:
            return None
        return self.torch_seq_us / self.best_us


def below_bound_note(summaries: list[WorkloadSummary]) -> str | None:
    """What to make of winners faster than the bound, where there are any (None otherwise)."""
    below = [
        s
        for s in summaries
        if s.device_us is not None and s.bound_us is not None and s.device_us < 0.99 * s.bound_us
    ]
    if not below:
        return None
    names = ", ".join(f"{s.workload} ({s.bound_us / s.device_us:.2f}× under)" for s in below)
    return (
        f"faster than the bound: {names}. The bound is max(GEMM alone, the fastest collective timed alone: "
        f"NCCL's, and the copy engine's except for gemm_ar, whose all-reduce is timed through NCCL only); a "
        f"winner below it moves its bytes faster than those, so there the bound is a reference, not a floor"
    )


def overhead_line(progress: SweepProgress) -> str:
    """Throughput, the coordinator's overhead per trial, and the gangs' idle time between trials."""
    parts = []
    if progress.measured:
        elapsed = progress.elapsed_s
        parts.append(
            f"{progress.measured} trial(s) in {fmt_duration(elapsed)} "
            f"({progress.measured / max(elapsed, 1e-9) * 60:.0f} per minute)"
        )
    if progress.handling_ms:
        h = sorted(progress.handling_ms)
        parts.append(
            f"coordinator overhead per trial: median {statistics.median(h):.2f} ms, "
            f"p95 {h[min(len(h) - 1, int(0.95 * len(h)))]:.2f} ms, max {h[-1]:.2f} ms"
        )
    if progress.idle_gap_ms:
        g = sorted(progress.idle_gap_ms)
        idle = (
            "idle between trials" if progress.where else "gang idle between trials (Ray round trip included)"
        )
        parts.append(f"{idle}: median {statistics.median(g):.2f} ms")
    return "; ".join(parts)
