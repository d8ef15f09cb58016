"""Kubernetes controllers' contracts, with pods played by network namespaces."""
