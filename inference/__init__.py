"""Inference: samplers, the condition cache, the critique/refine loop, independent judges and benchmarks."""
