"""Kubernetes adapter: scale targets, HPA floors, standby objects, pod starts, Events.

Pools are watched by :class:`ObjectStream` (a list-and-watch; with shards, a server-side
label selector per shard served).

Errors::

    KubeError        an API call failed (``.status`` is the HTTP status)
    └── NotFound     the object does not exist
"""

from prescaler.kube._client import (
    DELETION_COST_ANNOTATION,
    FIELD_MANAGER,
    KubeApi,
    KubeClient,
    field_writer,
    hpa_target_share,
    label_selector,
    load_api_client,
    parse_time,
    pod_start,
    rfc3339,
    scaled_object_from,
)
from prescaler.kube._lease import LeaseElector, LeaseTimings
from prescaler.kube._manifests import (
    HASH_ANNOTATION,
    PLACEHOLDER_PRIORITY_VALUE,
    POOL_LABEL,
    ROLE_DEGRADATION,
    ROLE_HOT,
    ROLE_LABEL,
    ROLE_PLACEHOLDER,
    ROLE_PRE_PULL,
    ROLE_PROMOTED,
    degradation_config_map,
    first_image,
    hot_standby_deployment,
    object_name,
    placeholder_deployment,
    placeholder_priority_class,
    pre_pull_daemonset,
    promotion_patch,
)
from prescaler.kube._shards import ShardLeases, lease_threads
from prescaler.kube._types import (
    KEDA_GROUP,
    KEDA_VERSION,
    SCALED_OBJECTS,
    FieldWriter,
    Hpa,
    KubeError,
    NotFound,
    ObjectRef,
    PodStart,
    ScaledObject,
    SecretData,
    StandbyObservation,
    Workload,
)
from prescaler.kube._watch import Event, Listed, ObjectStream

__all__ = [
    "DELETION_COST_ANNOTATION",
    "FIELD_MANAGER",
    "HASH_ANNOTATION",
    "KEDA_GROUP",
    "KEDA_VERSION",
    "PLACEHOLDER_PRIORITY_VALUE",
    "POOL_LABEL",
    "ROLE_DEGRADATION",
    "ROLE_HOT",
    "ROLE_LABEL",
    "ROLE_PLACEHOLDER",
    "ROLE_PRE_PULL",
    "ROLE_PROMOTED",
    "SCALED_OBJECTS",
    "Event",
    "FieldWriter",
    "Hpa",
    "KubeApi",
    "KubeClient",
    "KubeError",
    "LeaseElector",
    "LeaseTimings",
    "Listed",
    "NotFound",
    "ObjectRef",
    "ObjectStream",
    "PodStart",
    "ScaledObject",
    "SecretData",
    "ShardLeases",
    "StandbyObservation",
    "Workload",
    "degradation_config_map",
    "field_writer",
    "first_image",
    "hot_standby_deployment",
    "hpa_target_share",
    "label_selector",
    "lease_threads",
    "load_api_client",
    "object_name",
    "parse_time",
    "placeholder_deployment",
    "placeholder_priority_class",
    "pod_start",
    "pre_pull_daemonset",
    "promotion_patch",
    "rfc3339",
    "scaled_object_from",
]
