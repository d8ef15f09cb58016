"""``ddpkit k8s``: Kubernetes manifests for a ddpkit job."""
