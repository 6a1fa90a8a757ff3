"""Inference engines: the interface and scripted engine, the registry, transformers and vLLM."""
