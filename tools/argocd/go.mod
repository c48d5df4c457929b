module fibers.local/argocd

go 1.25.0

// Argo CD is built inside its own module (its go.mod replaces k8s.io/* and others), so this recipe
// only names the version: fetch.argocd downloads that module, copies it and builds ./cmd there.
require github.com/argoproj/argo-cd/v3 v3.2.0
