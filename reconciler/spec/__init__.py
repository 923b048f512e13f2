"""Desired state: spec files and markers, loaded, validated and typed."""
