"""A run as Kubernetes manifests: names, Strimzi, services, KEDA scaling, the image, files."""
