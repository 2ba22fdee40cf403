"""Whether KEDA's HPA carries a pool's plan (mode ``kedaTrigger``): told, and nudged when
allowed.

KEDA builds a ScaledObject's HPA from the metric specs its triggers' scalers give when it
reconciles the ScaledObject. An external scaler it cannot reach then (prescaler starting,
or rolling out) gives none, and KEDA builds the HPA from the other triggers (a cron or a
cpu one) and does not come back to it: KEDA's controller (``controllers/keda``, v2.21)
reconciles a ScaledObject when its spec changes (its generation), when one of KEDA's own
annotations on it changes (pause, force activation), when its Ready condition turns True,
or when the HPA it owns changes (labels, annotations, spec); never on a timer. Until one of
those happens the plan scales nothing.

:func:`follow` (pure) turns KEDA's view into the condition ``KedaTrigger``: ``True`` while
the HPA carries the trigger's metric; ``Unknown`` while KEDA has made no HPA (it retries
that itself) or the trigger has been missing for less than the grace; ``False``, with the
fix in its message, past it. :class:`TriggerWatch` adds the Warning Event (once per
episode), the metric ``prescaler_keda_trigger_missing`` and, with ``keda.nudge`` on, the
nudge: the annotation :data:`NUDGE_ANNOTATION` written on KEDA's HPA, which KEDA's watch
of the HPAs it owns turns into a reconcile of the ScaledObject, asking every trigger's
scaler for its metric spec again. The ScaledObject itself is never written: no generation
change, nothing for a GitOps tool to revert.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from prescaler.api import Condition, ConditionType, InferencePoolStatus, KedaStatus
from prescaler.controller.model import PoolObject, fleet_label
from prescaler.controller.status import (
    ConditionUpdate,
    Status,
    merge_conditions,
    parse_rfc3339,
    rfc3339,
)
from prescaler.kube import KubeApi, KubeError
from prescaler.metrics import Metrics

log = logging.getLogger("prescaler")

CONDITION: ConditionType = "KedaTrigger"
NUDGE_ANNOTATION = "prescaler.io/keda-reconcile"
"""Written on KEDA's HPA (the time, RFC 3339) to make KEDA reconcile its ScaledObject."""
MISSING_EVENT = "KedaTriggerMissing"
RESTORED_EVENT = "KedaTriggerInHpa"


@dataclass(frozen=True, slots=True)
class Followed:
    """What :func:`follow` makes of one reconcile's KEDA status."""

    keda: KedaStatus
    """The status, with ``missingSince`` and ``nudgedAt`` carried on."""
    condition: ConditionUpdate
    missing: bool
    """Missing past the grace (condition False)."""
    nudge: bool
    """A nudge is due now (``nudge_seconds`` given, the HPA known, the last one long ago)."""


def follow(
    keda: KedaStatus,
    previous: KedaStatus | None,
    pool: str,
    now: float,
    grace_seconds: float,
    nudge_seconds: float | None = None,
) -> Followed:
    """The condition ``KedaTrigger`` from this reconcile's ``keda`` and the last status's
    (pure). ``nudge_seconds``: nudges are on, at most one this often."""
    absent = keda.triggers == 0 or keda.metric is False
    nudged_at = previous.nudged_at if previous is not None else None
    since = None
    if absent:
        kept = previous.missing_since if previous is not None else None
        since = kept if parse_rfc3339(kept) is not None else rfc3339(now)
    keda = keda.model_copy(update={"missing_since": since, "nudged_at": nudged_at})
    so, hpa = keda.scaled_object, keda.hpa
    if not absent and keda.metric is None:
        return Followed(
            keda,
            ConditionUpdate(
                CONDITION,
                "Unknown",
                "NoHpa",
                f"KEDA's HPA for ScaledObject {so} is not known: KEDA makes it once it "
                "reaches a trigger's scaler, and retries that itself",
            ),
            missing=False,
            nudge=False,
        )
    if not absent:
        return Followed(
            keda,
            ConditionUpdate(
                CONDITION,
                "True",
                "InHpa",
                f"KEDA's HPA {hpa} asks this pool's trigger for the plan",
            ),
            missing=False,
            nudge=False,
        )
    assert since is not None
    started = parse_rfc3339(since)
    late = started is not None and now - started > grace_seconds
    status: Status = "False" if late else "Unknown"
    if keda.triggers == 0:
        message = (
            f"ScaledObject {so} has had no external trigger with metadata pool: {pool} since "
            f"{since}, so KEDA never asks for the plan. Fix: add one (type external or "
            "external-push, scalerAddress: prescaler's scaler, metadata pool: "
            f"{pool}; README, With KEDA)"
        )
        return Followed(keda, ConditionUpdate(CONDITION, status, "NoTrigger", message), late, False)
    last = parse_rfc3339(nudged_at)
    nudge = (
        late
        and nudge_seconds is not None
        and hpa is not None
        and (last is None or now - last >= nudge_seconds)
    )
    if nudge_seconds is None:
        fix = (
            f"make KEDA reconcile {so}: kubectl annotate hpa {hpa} {NUDGE_ANNOTATION}="
            "$(date +%s) --overwrite, or any change of its spec, or let the operator nudge it "
            "(setting keda.nudge)"
        )
    else:
        fix = (
            f"the operator nudges KEDA to reconcile {so} (annotation {NUDGE_ANNOTATION} on "
            f"HPA {hpa}) every {nudge_seconds:g} s while the trigger is missing"
            + (f", last at {nudged_at}" if nudged_at is not None else "")
        )
    message = (
        f"KEDA's HPA {hpa} has had no metric for this pool's trigger since {since}, so the "
        "plan scales nothing: KEDA left the trigger out when it could not reach prescaler's "
        f"scaler, and rebuilds its HPA only when ScaledObject {so} or the HPA changes. Fix: "
        f"check that KEDA reaches the scaler (the trigger's scalerAddress), then {fix}"
    )
    return Followed(keda, ConditionUpdate(CONDITION, status, "NotInHpa", message), late, nudge)


@dataclass(frozen=True, slots=True)
class TriggerWatch:
    """The operator's side of :func:`follow` (settings ``keda.*``)."""

    missing_periods: float = 2.0
    """The grace, in reconcile periods, before a missing trigger is reported."""
    nudge: bool = False
    """Nudge KEDA to rebuild its HPA (:data:`NUDGE_ANNOTATION`); off: only tell."""
    nudge_seconds: float = 60.0
    """At most one nudge per pool this often."""

    async def watch(
        self,
        kube: KubeApi,
        metrics: Metrics,
        pool: PoolObject,
        role: str | None,
        keda: KedaStatus | None,
        previous: InferencePoolStatus,
        now: float,
        interval_seconds: float,
        dry_run: bool = False,
    ) -> tuple[KedaStatus | None, ConditionUpdate | None]:
        """The pool's KEDA status and condition (``None``, ``None``: not mode
        ``kedaTrigger``); posts the Event of a change, sets the metric and nudges when due
        (never in a dry run: the operator writes nothing then)."""
        if keda is None:
            return None, None
        label = fleet_label(pool.name, role)
        grace = self.missing_periods * interval_seconds
        nudges = self.nudge_seconds if self.nudge and not dry_run else None
        followed = follow(keda, previous.keda, pool.name, now, grace, nudges)
        if followed.nudge and followed.keda.hpa is not None:
            error = None
            try:
                await kube.annotate_hpa(
                    pool.namespace, followed.keda.hpa, {NUDGE_ANNOTATION: rfc3339(now)}
                )
            except KubeError as exc:
                error = str(exc)[:200]
                log.warning("could not nudge KEDA for pool %s/%s: %s", pool.namespace, label, error)
            outcome = "written" if error is None else "failed"
            metrics.keda_nudges.labels(pool.namespace, label, outcome).inc()
            # The attempt counts either way: a refused write is not retried every period.
            again = followed.keda.model_copy(update={"nudged_at": rfc3339(now)})
            followed = follow(keda, again, pool.name, now, grace, self.nudge_seconds)
            if error is not None:
                update = followed.condition
                note = f"; the last nudge failed: {error}"
                followed = replace(
                    followed, condition=replace(update, message=update.message + note)
                )
        metrics.keda_trigger_missing.labels(pool.namespace, label).set(int(followed.missing))
        old = _condition(previous.conditions)
        update = followed.condition
        prefix = f"{role}: " if role is not None else ""
        try:
            if update.status == "False" and (
                old is None or old.status != "False" or old.reason != update.reason
            ):
                await kube.post_event(pool.ref, "Warning", MISSING_EVENT, prefix + update.message)
            elif update.status == "True" and old is not None and old.status == "False":
                await kube.post_event(pool.ref, "Normal", RESTORED_EVENT, prefix + update.message)
        except KubeError as exc:  # the condition says it still
            log.warning(
                "could not post the KEDA Event of pool %s/%s: %s", pool.namespace, label, exc
            )
        return followed.keda, update


def with_trigger_condition(
    status: InferencePoolStatus, update: ConditionUpdate | None, now: float, generation: int | None
) -> InferencePoolStatus:
    """The status with the ``KedaTrigger`` condition set, or removed (not mode
    ``kedaTrigger``)."""
    if update is None:
        kept = [c for c in status.conditions if c.type != CONDITION]
        if len(kept) == len(status.conditions):
            return status
        return status.model_copy(update={"conditions": kept})
    conditions = merge_conditions(status.conditions, [update], now, generation)
    return status.model_copy(update={"conditions": conditions})


def _condition(conditions: list[Condition]) -> Condition | None:
    return next((c for c in conditions if c.type == CONDITION), None)
