// Pinned Gateway API Inference Extension, for its CRDs only (config/crd/bases): the local
// test cluster installs them beside prescaler's. Nothing is built from it.
module prescaler.local/hack/cluster/tools/gie

go 1.26.0

require sigs.k8s.io/gateway-api-inference-extension v1.6.2
