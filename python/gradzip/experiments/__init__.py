"""Experiments that measure what compression does to training (need torch, and scikit-learn)."""
