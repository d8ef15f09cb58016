"""Sharded data loading: ``prepare_loader``, resumable samplers, batch plans, coverage."""
