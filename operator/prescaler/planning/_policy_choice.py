"""Which way a pool plans, from its own evidence: on the forecast, as its HPA would, or
as its HPA would with the forecast leading it.

Not every pool's traffic can be foretold. A pool that sets ``spec.policy: auto`` (the
default) replays its own recent demand under the candidates (the forecast planner at the
pool's settings; the HPA algorithm at a sweep of targets; and the HPA led by the forecast,
which adds the forecast mean's peak over the lookahead as a second metric) and plans with
the one that lies best against the HPA's curve on that demand:

* The **frontier ratio** of a candidate is its unserved demand over the HPA curve's at
  the same GPU-hours (:func:`frontier_ratio`). The reactive policy lies on that curve: its
  ratio is 1 by definition.
* The forecast is chosen with a clear margin below the curve (ratio at most
  ``1 - margin``); within the margin of it, the cheaper of the two by GPU-hours; beyond
  it, or dearer than the HPA at its dearest target (beyond its whole curve, where no
  reading of the curve stands), the reactive policy (:func:`judge`).
* The led HPA (``leading``) takes the place of either when it lies clearly below the
  curve too, and clearly below the forecast: it never releases sooner than the HPA, so it
  is never the cheaper; it can only be the less short.
* The first verdict (from the history a new pool replays) is taken at once. Later ones
  (a daily re-check) weigh the day pooled with the days before it (about three count),
  and switch only when the other candidate wins on ``days`` checks in a row
  (:func:`recheck`): one odd day does not flip the pool.

Pure: plain numbers in, a :class:`PolicyChoice` value out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "NEGLIGIBLE_WAITING",
    "POLICY_MARGIN",
    "POLICY_SWITCH_DAYS",
    "POOL_WEIGHT",
    "Evidence",
    "PolicyChoice",
    "PolicyName",
    "Verdict",
    "frontier_ratio",
    "judge",
    "recheck",
]

PolicyName = Literal["forecast", "reactive", "leading"]

POLICY_MARGIN = 0.2
"""How clearly the forecast must lie below the HPA's curve to be chosen (frontier ratio at
most 0.8), and within how much of the curve the cheaper candidate wins."""
POLICY_SWITCH_DAYS = 2
"""Daily re-checks in a row the other candidate must win before the pool switches."""
POOL_WEIGHT = 0.4
"""A new day's share of the pooled evidence a check weighs (the rest: the days before it,
fading): about the last three days count."""
NEGLIGIBLE_WAITING = 1e-4
"""A share of demand left waiting below which a day counts as served (one token in ten
thousand): where both the forecast and the HPA's curve leave less, their ratio is noise,
and the cheaper plans."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Both candidates replayed on the same demand (a pool's history, or its last day)."""

    forecast_unserved: float
    """The forecast planner's unserved demand, as a share of the demand."""
    forecast_gpu_hours: float
    reactive_unserved: float
    """The HPA at the pool's target: its unserved share."""
    reactive_gpu_hours: float
    hpa_curve: tuple[tuple[float, float], ...]
    """The HPA swept over its target: ``(gpu_hours, unserved)`` points."""
    leading_unserved: float | None = None
    """The HPA led by the forecast: its unserved share (``None``: not replayed)."""
    leading_gpu_hours: float | None = None

    def __post_init__(self) -> None:
        if (self.leading_unserved is None) != (self.leading_gpu_hours is None):
            raise ValueError("the led HPA's evidence needs both its numbers")
        numbers = (
            self.forecast_unserved,
            self.forecast_gpu_hours,
            self.reactive_unserved,
            self.reactive_gpu_hours,
            *(x for point in self.hpa_curve for x in point),
            *((self.leading_unserved, self.leading_gpu_hours) if self.led else ()),
        )
        if not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise ValueError("evidence must be finite and non-negative")
        if len(self.hpa_curve) < 2:
            raise ValueError("the HPA's curve needs at least two points")

    @property
    def led(self) -> bool:
        """Whether the HPA led by the forecast was replayed too."""
        return self.leading_unserved is not None and self.leading_gpu_hours is not None

    def pooled(self, earlier: Evidence | None, weight: float = POOL_WEIGHT) -> Evidence:
        """This evidence weighed with what earlier checks pooled: each number the mean of
        the two, this one counting ``weight`` (the HPA's points matched by their place in
        the sweep). One day's unserved demand sits in a few bursts, so a day alone reads
        the curve near zero, where a ratio is noise; days pooled read it as a week does."""
        if earlier is None or len(earlier.hpa_curve) != len(self.hpa_curve):
            return self

        def mix(new: float, old: float) -> float:
            return weight * new + (1 - weight) * old

        lu, lg = self.leading_unserved, self.leading_gpu_hours
        eu, eg = earlier.leading_unserved, earlier.leading_gpu_hours
        if lu is not None and lg is not None and eu is not None and eg is not None:
            lu, lg = mix(lu, eu), mix(lg, eg)
        # else: the first check that replayed it weighs its own numbers (or none were)
        return Evidence(
            mix(self.forecast_unserved, earlier.forecast_unserved),
            mix(self.forecast_gpu_hours, earlier.forecast_gpu_hours),
            mix(self.reactive_unserved, earlier.reactive_unserved),
            mix(self.reactive_gpu_hours, earlier.reactive_gpu_hours),
            tuple(
                (mix(g, g0), mix(u, u0))
                for (g, u), (g0, u0) in zip(self.hpa_curve, earlier.hpa_curve, strict=True)
            ),
            lu,
            lg,
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one piece of evidence says."""

    policy: PolicyName
    ratio: float | None
    """The forecast's frontier ratio (``inf``: the curve leaves nothing waiting there and
    the forecast does; ``None``: neither leaves anything waiting)."""
    reason: str
    leading_ratio: float | None = None
    """The led HPA's frontier ratio, where it was replayed."""


def frontier_ratio(
    unserved: float, gpu_hours: float, curve: Sequence[tuple[float, float]]
) -> float | None:
    """``unserved`` over the HPA curve's unserved at ``gpu_hours`` (linear between its
    points). Past either end of the curve the end's value stands: a plan dearer than the
    HPA's dearest point is held to what that point leaves waiting, one cheaper than its
    cheapest to what that one leaves. ``None`` where both leave less than
    :data:`NEGLIGIBLE_WAITING`; ``inf`` where the curve leaves nothing and ``unserved``
    is more than that."""
    points = sorted(curve)
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    if gpu_hours <= xs[0]:
        on_curve = ys[0]
    elif gpu_hours >= xs[-1]:
        on_curve = ys[-1]
    else:
        i = next(k for k in range(1, len(xs)) if xs[k] >= gpu_hours)
        span = xs[i] - xs[i - 1]
        w = (gpu_hours - xs[i - 1]) / span if span > 0 else 1.0
        on_curve = ys[i - 1] + w * (ys[i] - ys[i - 1])
    if unserved < NEGLIGIBLE_WAITING and on_curve < NEGLIGIBLE_WAITING:
        return None
    if on_curve <= 0:
        return math.inf
    return unserved / on_curve


def judge(evidence: Evidence, margin: float = POLICY_MARGIN) -> Verdict:
    """The candidate the evidence favours (see the module docstring): the forecast or the
    reactive policy as :func:`_forecast_or_reactive` weighs them, unless the led HPA lies
    at most ``1 - margin`` of the curve and, where the forecast was chosen, ``margin``
    below the forecast's ratio too."""
    if not 0 <= margin < 1:
        raise ValueError("the margin must be in [0, 1)")
    verdict = _forecast_or_reactive(evidence, margin)
    e = evidence
    if e.leading_unserved is None or e.leading_gpu_hours is None:
        return verdict
    ratio = frontier_ratio(e.leading_unserved, e.leading_gpu_hours, e.hpa_curve)
    verdict = replace(verdict, leading_ratio=ratio)
    if ratio is None or ratio > 1 - margin:
        return verdict
    if e.leading_gpu_hours > max(gpu for gpu, _ in e.hpa_curve):
        return verdict
    cost = e.leading_gpu_hours / e.reactive_gpu_hours if e.reactive_gpu_hours > 0 else math.inf
    led = (
        f"the HPA led by the forecast left {e.leading_unserved:.3%} waiting at {cost:.2f} x "
        f"the HPA's GPU-hours: {ratio:.2f} of its curve"
    )
    if verdict.policy == "forecast":
        if verdict.ratio is None or ratio > verdict.ratio - margin:
            return verdict
        return replace(verdict, policy="leading", reason=f"{led}, below {verdict.reason}")
    return replace(verdict, policy="leading", reason=f"{led}; {verdict.reason}")


def _forecast_or_reactive(e: Evidence, margin: float) -> Verdict:
    """The forecast against the reactive policy (see the module docstring)."""
    ratio = frontier_ratio(e.forecast_unserved, e.forecast_gpu_hours, e.hpa_curve)
    cost = e.forecast_gpu_hours / e.reactive_gpu_hours if e.reactive_gpu_hours > 0 else math.inf
    said = (
        f"the forecast left {e.forecast_unserved:.3%} waiting at {cost:.2f} x the HPA's "
        f"GPU-hours (the HPA {e.reactive_unserved:.3%})"
    )
    cheaper: PolicyName = "forecast" if e.forecast_gpu_hours < e.reactive_gpu_hours else "reactive"
    dearest = max(gpu for gpu, _ in e.hpa_curve)
    if e.forecast_gpu_hours > dearest:
        return Verdict(
            "reactive",
            ratio,
            f"{said}: dearer than the HPA at its dearest target, beyond its whole curve",
        )
    if ratio is None:
        return Verdict(cheaper, None, f"{said}: both served all but a trace, the cheaper plans")
    if ratio <= 1 - margin:
        return Verdict("forecast", ratio, f"{said}: {ratio:.2f} of the HPA's curve")
    if ratio < 1 + margin:
        return Verdict(
            cheaper,
            ratio,
            f"{said}: {ratio:.2f} of the HPA's curve, within the margin, the cheaper plans",
        )
    shown = "beyond" if math.isinf(ratio) else f"{ratio:.2f} of"
    return Verdict("reactive", ratio, f"{said}: {shown} the HPA's curve")


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """The policy a pool plans with, why, and since when."""

    policy: PolicyName
    since: float
    """When it came into force (unix seconds)."""
    reason: str
    checked_at: float
    """When the evidence was last weighed."""
    ratio: float | None = None
    """The forecast's frontier ratio at that check."""
    pending: int = 0
    """Checks in a row the other candidate has won since (a switch needs ``days``)."""
    switches: int = 0
    evidence: Evidence | None = None
    """The evidence pooled over the checks so far (:meth:`Evidence.pooled`)."""
    leading_ratio: float | None = None
    """The led HPA's frontier ratio at that check (``None`` where it was not replayed)."""


def recheck(
    choice: PolicyChoice | None,
    evidence: Evidence,
    now: float,
    *,
    margin: float = POLICY_MARGIN,
    days: int = POLICY_SWITCH_DAYS,
) -> PolicyChoice:
    """The choice after weighing ``evidence`` at ``now``, pooled with the earlier checks'
    (:meth:`Evidence.pooled`): the first verdict at once, later ones only after ``days``
    in a row."""
    pooled = evidence.pooled(choice.evidence if choice is not None else None)
    verdict = judge(pooled, margin)
    led = verdict.leading_ratio
    if choice is None:
        return PolicyChoice(
            verdict.policy, now, verdict.reason, now, verdict.ratio, 0, 0, pooled, led
        )
    if verdict.policy == choice.policy:
        return replace(
            choice,
            reason=verdict.reason,
            checked_at=now,
            ratio=verdict.ratio,
            pending=0,
            evidence=pooled,
            leading_ratio=led,
        )
    pending = choice.pending + 1
    if pending < days:
        return replace(
            choice,
            reason=f"{choice.reason}; the last check favoured {verdict.policy} "
            f"({pending} of {days} in a row needed)",
            checked_at=now,
            ratio=verdict.ratio,
            pending=pending,
            evidence=pooled,
            leading_ratio=led,
        )
    return PolicyChoice(
        verdict.policy,
        now,
        f"{verdict.reason} ({days} checks in a row)",
        now,
        verdict.ratio,
        0,
        choice.switches + 1,
        pooled,
        led,
    )
