"""Someone else changed the target's replicas: detection, policy and status (pure).

The operator records in ``status.appliedReplicas`` the replicas (in ``hpaFloor`` mode: the
HPA's ``minReplicas``) it last set or kept on the target. On the next reconcile the target
holding another value means one of two things, told apart by ``managedFields``:

- the operator wrote it itself, and the status write that should have recorded it was lost
  (the process was killed in between, or the write failed): the value is adopted, and
  ``lastScale*Time`` is restored (the write's time in ``managedFields``, or, where it has
  none as for the scale subresource, the time it is found: never earlier than the scale,
  so stabilization can only last longer);
- another field manager wrote it (``kubectl scale``, a person's ``kubectl edit``, another
  controller): an external change. It is reported (``status.externalChange``, condition
  ``ExternalChange``, a Warning Event naming the manager) and handled by
  ``spec.externalChanges``:

  ``revert``   the plan is applied as usual, which puts the operator's value back;
  ``respect``  the other value holds until the plan asks for something else than it did
               at the change; then the operator scales again (``Resumed``);
  ``pause``    the operator stops scaling the target until the pool's spec is edited (its
               generation moves) or the target's replicas return to the operator's value.

In ``hpaFloor`` mode the operator owns only the HPA's floor: the HPA changing the
workload's replicas is its job and never an external change. An HPA that KEDA owns (a
ScaledObject's) is refused in that mode (:func:`keda_owned_hpa`): KEDA writes its floor
from the ScaledObject's ``minReplicaCount``, and the two would fight. In ``kedaTrigger``
mode the operator writes nothing: KEDA owns the workload and its HPA, and nothing they do
is an external change.

``status.appliedTarget`` names the object ``appliedReplicas`` was set on. When
``spec.target`` names another object (a rename), what the operator remembers of the old
one (its value, a change found on it and the policy in effect) is dropped, not compared
with the new target: the new target starts as one the operator has not scaled yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from prescaler.api import ExternalChangeStatus, InferencePoolSpec, InferencePoolStatus, target_of
from prescaler.controller.model import Gathered
from prescaler.controller.status import ConditionUpdate, merge_conditions, parse_rfc3339, rfc3339
from prescaler.kube import FIELD_MANAGER
from prescaler.planning import ScalePlan

Action = Literal["Reverted", "Respected", "Paused", "Resumed"]
ACTIONS: dict[str, Action] = {"revert": "Reverted", "respect": "Respected", "pause": "Paused"}


@dataclass(frozen=True, slots=True)
class Examined:
    """What the target's replicas say about who changed them since the last reconcile."""

    previous: InferencePoolStatus
    """The previous status, with scale times restored from a lost write of our own."""
    found: ExternalChangeStatus | None
    """An external change found in this reconcile."""
    standing: ExternalChangeStatus | None
    """The change whose policy is in effect (found now or earlier; respected or paused)."""
    adopted: bool = False
    """The target held our own write that the status had not recorded."""


def examine(
    spec: InferencePoolSpec,
    generation: int | None,
    previous: InferencePoolStatus,
    gathered: Gathered,
    now: float,
) -> Examined:
    """Compare the target with the operator's last value (pure)."""
    if previous.applied_target not in (None, applied_target(spec)):
        previous = previous.model_copy(update={"applied_replicas": None, "external_change": None})
    last = previous.external_change
    standing = last if last is not None and last.action in ("Respected", "Paused") else None
    applied = previous.applied_replicas
    observed = gathered.current_replicas
    writer = gathered.current_writer
    ours = writer is not None and writer.manager == FIELD_MANAGER
    if spec.dry_run or spec.mode == "kedaTrigger" or observed == applied:
        return Examined(previous, None, standing)
    if applied is None:
        # No write of ours is recorded. If the target still holds one anyway, its status
        # write was lost (say, the operator was killed between the scale and the status):
        # keep the scale's time, and count it as a scale-up, which holds scale-downs for a
        # stabilization period rather than allowing one early.
        if ours and writer is not None:
            restored = _restore_scale_time(previous, True, writer.time or now)
            return Examined(restored, None, standing, adopted=True)
        return Examined(previous, None, standing)
    if standing is not None and observed == standing.from_replicas:
        return Examined(previous, None, standing)  # put back: the policy ends (govern)
    if ours and writer is not None:
        restored = _restore_scale_time(previous, observed > applied, writer.time or now)
        return Examined(restored, None, standing, adopted=True)
    # What the plan asked for (before pacing), so respect ends when the plan moves, not
    # when pacing from the other value differs.
    planned = previous.plan.target_replicas if previous.plan is not None else applied
    found = ExternalChangeStatus(
        manager=writer.manager if writer is not None else "unknown",
        changed_at=rfc3339(writer.time) if writer is not None and writer.time else None,
        detected_at=rfc3339(now),
        from_replicas=applied,
        to_replicas=observed,
        action=ACTIONS[spec.external_changes],
        planned_replicas=planned if spec.external_changes == "respect" else None,
        generation=generation if spec.external_changes == "pause" else None,
    )
    return Examined(previous, found, found if spec.external_changes != "revert" else None)


def keda_owned_hpa(hpa: str, scaled_object: str) -> str:
    """Why a pool in mode ``hpaFloor`` does not raise the floor of an HPA that KEDA owns,
    and what to do instead."""
    return (
        f"HPA {hpa} is owned by KEDA ScaledObject {scaled_object}, which writes its "
        "minReplicas from the ScaledObject's minReplicaCount: prescaler does not fight it. "
        f"Set spec.target to {{kind: ScaledObject, name: {scaled_object}}} with "
        "spec.mode: kedaTrigger, and add prescaler's external trigger to that ScaledObject "
        "(README, 'With KEDA'); KEDA then scales to the largest of the plan and its other "
        "triggers"
    )


def applied_target(spec: InferencePoolSpec) -> str:
    """The target as ``status.appliedTarget`` names it: ``<kind>/<name>``."""
    target = target_of(spec)
    return f"{target.kind}/{target.name}"


def _restore_scale_time(
    previous: InferencePoolStatus, up: bool, written: float
) -> InferencePoolStatus:
    """Our own scale (``up`` or down) at ``written`` that the status missed.

    ``managedFields`` keeps no time for writes through the scale subresource; the time the
    scale was found then stands in. It is later than the scale, so stabilization after it
    can only last longer than it should, never shorter.
    """
    recorded = parse_rfc3339(previous.last_scale_time)
    if recorded is not None and recorded >= written:
        return previous
    stamp = rfc3339(written)
    update = {"last_scale_time": stamp}
    update["last_scale_up_time" if up else "last_scale_down_time"] = stamp
    return previous.model_copy(update=update)


def govern(
    spec: InferencePoolSpec,
    generation: int | None,
    examined: Examined,
    decision: ScalePlan,
) -> tuple[ScalePlan, ExternalChangeStatus | None]:
    """The plan under ``spec.externalChanges``, and the change record to keep in status."""
    record = examined.found or examined.previous.external_change
    standing = examined.standing
    if standing is None or spec.dry_run:
        return decision, record
    put_back = decision.current_replicas == standing.from_replicas
    if standing.action == "Respected":
        holds = not put_back and decision.target_replicas == standing.planned_replicas
        why = f"the plan is still {standing.planned_replicas}"
    else:
        holds = not put_back and generation == standing.generation
        why = "the spec has not been edited since"
    if not holds:
        return decision, standing.model_copy(update={"action": "Resumed"})
    held = replace(
        decision,
        desired_replicas=decision.current_replicas,
        action="hold",
        promote_replicas=0,
        reason=(
            f"held at {decision.current_replicas} set by {standing.manager} "
            f"(spec.externalChanges: {spec.external_changes}; {why}); "
            f"the plan asks for {decision.desired_replicas}: {decision.reason}"
        ),
    )
    return held, standing


def describe(change: ExternalChangeStatus, spec: InferencePoolSpec) -> str:
    """One line: who changed what, when, and what the operator does about it."""
    target = target_of(spec)
    what = (
        f"minReplicas of HPA {target.name}"
        if spec.mode == "hpaFloor"
        else f"replicas of {target.kind} {target.name}"
    )  # never kedaTrigger: examine finds no change there
    when = f" at {change.changed_at}" if change.changed_at else ""
    doing = {
        "Reverted": "reverting to the plan",
        "Respected": f"keeping {change.to_replicas} while the plan stays at "
        f"{change.planned_replicas}",
        "Paused": "scaling paused until the pool's spec is edited or the replicas are put back",
        "Resumed": "scaling again",
    }[change.action]
    return (
        f"{change.manager} changed {what} {change.from_replicas} -> {change.to_replicas}{when}, "
        f"not this operator; {doing} (spec.externalChanges: {spec.external_changes})"
    )


def record(
    status: InferencePoolStatus,
    spec: InferencePoolSpec,
    examined: Examined,
    change: ExternalChangeStatus | None,
    decision: ScalePlan,
    now: float,
    generation: int | None,
) -> InferencePoolStatus:
    """The composed status with the operator's value, the change record and the condition."""
    holding = change is not None and change.action in ("Respected", "Paused")
    if spec.dry_run:
        update = ConditionUpdate("ExternalChange", "Unknown", "DryRun", "nothing is applied")
    elif spec.mode == "kedaTrigger":
        update = ConditionUpdate(
            "ExternalChange",
            "False",
            "KedaScales",
            "KEDA scales the workload to the largest of its triggers, the plan among them; "
            "nothing it writes is an external change",
        )
    elif examined.found is not None or holding:
        assert change is not None
        update = ConditionUpdate("ExternalChange", "True", change.action, describe(change, spec))
    else:
        last = f"; last: {describe(change, spec)}" if change is not None else ""
        update = ConditionUpdate(
            "ExternalChange", "False", "InControl", f"the target holds the plan's value{last}"
        )
    conditions = merge_conditions(status.conditions, [update], now, generation)
    return status.model_copy(
        update={
            "conditions": conditions,
            "applied_replicas": None if spec.dry_run else decision.desired_replicas,
            "applied_target": None if spec.dry_run else applied_target(spec),
            "external_change": change,
        }
    )
