"""kwok Stage configuration for the fake GPU fleet.

Pod lifecycle, chained by selectors:

1. ``pod-start``: a pod bound to a fake node gets an IP and goes ``Running`` at once,
   with its containers started but not Ready (the engine is pulling the image and
   loading weights).
2. ``pod-containers-ready-gpu`` / ``pod-containers-ready-cpu``: after a delay its
   containers are ready (``ContainersReady``). The delay is the pod annotation
   ``prescaler.io/fake-ready-delay`` (a Go duration such as ``"45s"``) if present, else the
   cluster default for pods that request ``nvidia.com/gpu`` (a model server cold start) or
   for other pods (near instant).
3. ``pod-ready``: a pod whose containers are ready becomes Ready once every condition its
   ``spec.readinessGates`` names is ``True``, at once for a pod without gates: the
   kubelet's rule, so a gated pod stays out of its Services until someone sets the
   condition (``prescaler.io/prewarmed``, by the operator).
4. ``pod-delete``: a pod marked for deletion is removed shortly after, as a kubelet
   would once its containers stopped.

A pod annotated ``prescaler.io/fake-not-ready`` fails its readiness probe for as long as
the annotation is there (an engine that hangs or crashes): ``pod-not-ready`` takes a ready
one out (``ContainersReady`` and ``Ready`` turn ``False``), and ``pod-held-not-ready``
keeps one that was still starting from turning ready (its pending ``ContainersReady`` is
replaced by a job an hour away). Removing the annotation lets stage 2 run again, after
the pod's delay.

Nodes are initialised Ready (keeping the capacity set at creation) and heartbeat
through their status; kwok renews their leases.
"""

from __future__ import annotations

READY_DELAY_ANNOTATION = "prescaler.io/fake-ready-delay"
NOT_READY_ANNOTATION = "prescaler.io/fake-not-ready"
GPU_RESOURCE = "nvidia.com/gpu"

_NODE_INITIALIZE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ NodeName | Quote }}
        type: Hostname
      allocatable:
      {{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}
        cpu: "32"
        memory: 256Gi
        pods: "110"
      {{ end }}
      capacity:
      {{ with .status.capacity }}{{ YAML . 1 }}{{ else }}
        cpu: "32"
        memory: 256Gi
        pods: "110"
      {{ end }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        osImage: fake
        bootID: ""
        machineID: ""
        systemUUID: ""
      phase: Running
"""

_NODE_HEARTBEAT = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay:
    durationMilliseconds: 20000
    jitterDurationMilliseconds: 25000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""

_POD_START = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-start
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.podIP'
      operator: DoesNotExist
  next:
    event:
      type: Normal
      reason: Started
      message: Started container (fake); loading model
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastProbeTime: null
        lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastProbeTime: null
        lastTransitionTime: {{ $now | Quote }}
        reason: ContainersNotReady
        status: "False"
        type: Ready
      - lastProbeTime: null
        lastTransitionTime: {{ $now | Quote }}
        reason: ContainersNotReady
        status: "False"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""  # noqa: E501

_POD_CONTAINERS_READY = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-containers-ready-{kind}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "ContainersReady" ) | .status'
      operator: In
      values: ['False']
    - key: '.spec.containers.[].resources.requests["{gpu}"]'
      operator: {gpu_op}
    - key: '.metadata.annotations["{not_ready}"]'
      operator: DoesNotExist
  delay:
    durationMilliseconds: {delay_ms}
    durationFrom:
      expressionFrom: '.metadata.annotations["{annotation}"]'
  next:
    event:
      type: Normal
      reason: ModelLoaded
      message: Readiness probe passed (fake)
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastProbeTime: null
        lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: ContainersReady
      containerStatuses:
      {{{{ range $i, $c := .spec.containers }}}}
      - image: {{{{ $c.image | Quote }}}}
        name: {{{{ $c.name | Quote }}}}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $.status.startTime | Quote }}}}
      {{{{ end }}}}
"""

# True when every readiness gate's condition is True (so also for a pod without gates).
_GATES_MET = (
    ". as $pod | [($pod.spec.readinessGates // [])[] | .conditionType as $t"
    ' | any(($pod.status.conditions // [])[]; .type == $t and .status == "True")] | all'
)

_POD_READY = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "ContainersReady" ) | .status'
      operator: In
      values: ['True']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['False']
    - key: '{_GATES_MET}'
      operator: In
      values: ['true']
    - key: '.metadata.annotations["{NOT_READY_ANNOTATION}"]'
      operator: DoesNotExist
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastProbeTime: null
        lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Ready
"""

_POD_NOT_READY = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-not-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.metadata.annotations["{NOT_READY_ANNOTATION}"]'
      operator: Exists
    - key: '.status.conditions.[] | select( .type == "ContainersReady" ) | .status'
      operator: In
      values: ['True']
  next:
    event:
      type: Warning
      reason: Unhealthy
      message: Readiness probe failed (fake)
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastProbeTime: null
        lastTransitionTime: {{{{ $now | Quote }}}}
        reason: ContainersNotReady
        status: "False"
        type: ContainersReady
      - lastProbeTime: null
        lastTransitionTime: {{{{ $now | Quote }}}}
        reason: ContainersNotReady
        status: "False"
        type: Ready
      containerStatuses:
      {{{{ range $i, $c := .spec.containers }}}}
      - image: {{{{ $c.image | Quote }}}}
        name: {{{{ $c.name | Quote }}}}
        ready: false
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $.status.startTime | Quote }}}}
      {{{{ end }}}}
"""

# Matches (and so replaces the pending job of) an annotated pod that is not ready; an hour
# away, it changes nothing but posts an Event.
_POD_HELD_NOT_READY = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-held-not-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.metadata.annotations["{NOT_READY_ANNOTATION}"]'
      operator: Exists
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "ContainersReady" ) | .status'
      operator: In
      values: ['False']
  delay:
    durationMilliseconds: 3600000
  next:
    event:
      type: Warning
      reason: Unhealthy
      message: Readiness probe still failing (fake)
"""

_POD_DELETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
    - key: '.metadata.finalizers'
      operator: DoesNotExist
  delay:
    durationMilliseconds: {delay_ms}
  next:
    delete: true
"""


def stages_yaml(
    gpu_ready_delay_s: float, cpu_ready_delay_s: float, delete_delay_s: float = 0.5
) -> str:
    """All Stage documents as one multi-document YAML for ``kwok --config``."""

    def ms(seconds: float) -> int:
        return max(0, round(seconds * 1000))

    docs = [
        _NODE_INITIALIZE,
        _NODE_HEARTBEAT,
        _POD_START,
        _POD_CONTAINERS_READY.format(
            kind="gpu",
            gpu=GPU_RESOURCE,
            gpu_op="Exists",
            delay_ms=ms(gpu_ready_delay_s),
            annotation=READY_DELAY_ANNOTATION,
            not_ready=NOT_READY_ANNOTATION,
        ),
        _POD_CONTAINERS_READY.format(
            kind="cpu",
            gpu=GPU_RESOURCE,
            gpu_op="DoesNotExist",
            delay_ms=ms(cpu_ready_delay_s),
            annotation=READY_DELAY_ANNOTATION,
            not_ready=NOT_READY_ANNOTATION,
        ),
        _POD_READY,
        _POD_NOT_READY,
        _POD_HELD_NOT_READY,
        _POD_DELETE.format(delay_ms=ms(delete_delay_s)),
    ]
    return "---\n".join(docs)
